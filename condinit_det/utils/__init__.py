"""The ground layer: small utilities every other part may use and that use no other part.

- :mod:`.fileio`: atomic file writes;
- :mod:`.checkpoint_io`: reading checkpoints without running code, writing safetensors;
- :mod:`.distributed`: launching processes, comparing replicas, rank 0's buffers;
- :mod:`.preemption`: the time-limit signal and the agreed stop for a requeue.
"""
