"""The records a run leaves, read by the stages, the launcher, the status command and the report.

- :mod:`.layout`: where runs live (arm x seed x lr scale), the plan file ``experiment.json``;
- :mod:`.results`: ``results.json``, the evaluations and failures of one run;
- :mod:`.identity`: the arm report and the run identity a resume must match;
- :mod:`.failures`: failure notes of the training processes and the run's ``"failed"`` record.

Pure Python and the init package's arm names: no detectron2, timm or torch.distributed import.
"""
