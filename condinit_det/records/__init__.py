"""The records a run leaves (layout and plan, ``results.json``, arm report, failures, ownership lock, Slurm jobs,
per-image evaluations): docs/training.md. No detectron2 or timm import: they are read on any machine.
"""
