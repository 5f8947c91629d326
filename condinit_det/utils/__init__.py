"""The ground layer: small utilities every other part may use and that use no other part.

- :mod:`.fileio`: atomic file writes;
- :mod:`.checkpoint_io`: reading checkpoints without running code, writing safetensors;
- :mod:`.distributed`: launching processes, comparing replicas, rank 0's buffers;
- :mod:`.preemption`: the time-limit signal and the agreed stop for a requeue;
- :mod:`.threads`: threads and data-loader workers from the CPUs a job was given;
- :mod:`.logs`: each run's log (detectron2's logger setup);
- :mod:`.errors`: :class:`~.errors.UsageError`, the one error type for bad input.
"""
