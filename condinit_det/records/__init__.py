"""The records a run leaves, read by the stages, the launcher, the status command and the report.

- :mod:`.layout`: where runs live (arm x seed x lr scale), the plan file ``experiment.json``;
- :mod:`.results`: ``results.json``, the evaluations and failures of one run;
- :mod:`.identity`: the arm report and the run identity a resume must match;
- :mod:`.failures`: failure notes of the training processes and the run's ``"failed"`` record;
- :mod:`.lock`: one owner per run directory (``.owner.lock``);
- :mod:`.per_image`: the per-image evaluation data the report resamples.

No detectron2 or timm import: the report and the status command read records on any machine.
"""
