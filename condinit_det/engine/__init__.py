"""detectron2 training glue: the AP hook and the train/eval entry points behind ``tools/train_net.py``.

The results file shared with the pretraining stage and the report is :mod:`condinit_det.records.results`.
"""
