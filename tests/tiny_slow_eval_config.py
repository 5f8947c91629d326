# tiny_train_config.py with an evaluator that announces itself and takes a few seconds, so that a test
# can kill a run in the middle of an evaluation (SLOW_EVAL_MARKER names the file it creates).
import os
import time

from detectron2.config import LazyCall as L
from detectron2.evaluation import COCOEvaluator

from .tiny_train_config import condinit, dataloader, lr_multiplier, model, optimizer, train  # noqa: F401


class AnnouncedSlowEvaluator(COCOEvaluator):
    def evaluate(self, img_ids=None):
        marker = os.environ.get("SLOW_EVAL_MARKER")
        if marker:
            with open(marker, "a") as f:
                f.write("evaluating\n")
        time.sleep(float(os.environ.get("SLOW_EVAL_SECONDS", "0")))
        return super().evaluate(img_ids)


dataloader.evaluator = L(AnnouncedSlowEvaluator)(
    dataset_name="condinit_tiny_val",
    tasks=("bbox", "segm"),
    use_fast_impl=False,
)
