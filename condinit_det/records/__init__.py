"""The records a run leaves (layout and plan, ``results.json``, arm report, failures, ownership lock, Slurm jobs,
per-image evaluations), read by the stages, the launcher, the status command and the report: docs/training.md.

No detectron2 or timm import: the report and the status command read records on any machine.
"""
