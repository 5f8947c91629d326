# Epoch-based multi-step schedules (mmdetection-style recipes) expressed in detectron2 iterations.
from fvcore.common.param_scheduler import MultiStepParamScheduler

from detectron2.config import LazyCall as L
from detectron2.solver import WarmupParamScheduler

# coco_2017_train as detectron2 trains on it: 118,287 images less the 1,021 without usable annotations that its
# loader drops (filter_empty); mmdetection's 36-epoch schedules count epochs over the same 117,266.
COCO_TRAIN_IMAGES = 117266


def epochs_to_iters(epochs, images_per_batch, num_images=COCO_TRAIN_IMAGES):
    """Iterations covering ``epochs`` passes over ``num_images`` images at ``images_per_batch``."""
    return int(round(epochs * num_images / images_per_batch))


def multistep_epochs(epochs, milestone_epochs, images_per_batch, warmup_iters=500, warmup_factor=0.001):
    """(max_iter, lr_multiplier): LR x0.1 at each milestone epoch, linear warmup over ``warmup_iters``."""
    max_iter = epochs_to_iters(epochs, images_per_batch)
    lr_multiplier = L(WarmupParamScheduler)(
        scheduler=L(MultiStepParamScheduler)(
            values=[10.0**-i for i in range(len(milestone_epochs) + 1)],
            milestones=[epochs_to_iters(e, images_per_batch) for e in milestone_epochs],
            num_updates=max_iter,
        ),
        warmup_length=warmup_iters / max_iter,
        warmup_method="linear",
        warmup_factor=warmup_factor,
    )
    return max_iter, lr_multiplier
