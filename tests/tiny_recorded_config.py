# tiny_train_config.py whose detector appends, at every training step, [rank, iteration, image ids] as one JSON line
# to the file TRAINED_IMAGES names: what each iteration trained on, for tests/test_exact_resume.py.
import json
import os

from detectron2.modeling import GeneralizedRCNN
from detectron2.utils import comm
from detectron2.utils.events import get_event_storage

from .tiny_train_config import condinit, dataloader, lr_multiplier, model, optimizer, train  # noqa: F401


class RecordingRCNN(GeneralizedRCNN):
    def forward(self, batched_inputs):
        if self.training and os.environ.get("TRAINED_IMAGES"):
            line = [comm.get_rank(), get_event_storage().iter, [d["image_id"] for d in batched_inputs]]
            with open(os.environ["TRAINED_IMAGES"], "a") as f:
                f.write(json.dumps(line) + "\n")
        return super().forward(batched_inputs)


model._arm_target_ = RecordingRCNN  # the detector armed() builds (condinit_det.modeling.arm)
