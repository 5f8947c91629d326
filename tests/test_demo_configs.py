"""The CPU demo configs load, build a tiny model with its attention sites, and answer an inference pass."""

from pathlib import Path

import pytest
import torch

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "demo"
DEMOS = {
    # config file -> (attention-site kind, number of attention blocks)
    "mask_rcnn_vit_tiny.py": ("d2_vit", 4),
    "mask_rcnn_swin_tiny.py": ("d2_swin", 6),
}


@pytest.fixture(scope="module", autouse=True)
def data_dir(tmp_path_factory):
    """Keep the generated dataset out of the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CONDINIT_DATA", str(tmp_path_factory.mktemp("condinit_data")))
        yield


def _load(name):
    from detectron2.config import LazyConfig

    return LazyConfig.load(str(CONFIG_DIR / name))


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_demo_config_builds_and_answers(name):
    """The config's model, optimizer, schedule and data, and an inference pass; its training step runs in the every
    config end to end test (tests/test_configs_end_to_end.py: the losses it logs, finite weights after it)."""
    from detectron2.config import instantiate

    from condinit_det.data import DATASET_NAMES, SHAPE_CLASSES

    cfg = _load(name)
    assert cfg.condinit == dict(arm="default", seed=0, include=None, exclude=None, options={})
    assert cfg.train.device == "cpu"
    assert cfg.dataloader.train.dataset.names == DATASET_NAMES[0]
    assert cfg.dataloader.test.dataset.names == DATASET_NAMES[1]
    assert cfg.dataloader.evaluator.dataset_name == DATASET_NAMES[1]
    assert cfg.model.roi_heads.num_classes == len(SHAPE_CLASSES)

    torch.manual_seed(0)
    model = instantiate(cfg.model)
    n_params = sum(p.numel() for p in model.parameters())
    assert 2e5 < n_params < 3e6, n_params  # tiny: trains on a CPU in minutes

    cfg.optimizer.params.model = model
    assert isinstance(instantiate(cfg.optimizer), torch.optim.AdamW)
    scheduler = instantiate(cfg.lr_multiplier)
    assert scheduler(0.0) < 0.01 and scheduler(0.5) == pytest.approx(0.51, abs=0.05) and scheduler(0.999) < 0.05

    batch = next(iter(instantiate(cfg.dataloader.train)))
    assert len(batch) == cfg.dataloader.train.total_batch_size
    assert tuple(batch[0]["image"].shape) == (3, 128, 128)

    model.eval()
    test_batch = next(iter(instantiate(cfg.dataloader.test)))
    with torch.no_grad():
        outputs = model(test_batch[:2])
    inst = outputs[0]["instances"]
    assert inst.image_size == (128, 128)
    assert inst.has("pred_masks") and inst.has("pred_boxes")


@pytest.mark.parametrize("name", sorted(DEMOS))
def test_demo_backbone_attention_sites(name):
    init = pytest.importorskip("condinit_det.init")
    from detectron2.config import instantiate

    kind, count = DEMOS[name]
    sites = init.find_attention(instantiate(_load(name).model))
    assert [s.kind for s in sites] == [kind] * count
    assert all(s.name.startswith("backbone.") for s in sites)


def test_the_plan_names_the_training_and_the_evaluation_data():
    """A user's own data registered as nuclei_train / nuclei_val: the plan records both, so that the report's title
    names the set its AP is measured on; pretraining names its root's evaluation split."""
    from condinit_det.engine import DetectionStage
    from condinit_det.pretrain import PretrainStage, load_config

    cfg = _load("mask_rcnn_vit_tiny.py")
    cfg.dataloader.train.dataset.names = "nuclei_train"
    cfg.dataloader.test.dataset.names = "nuclei_val"
    cfg.dataloader.evaluator.dataset_name = "nuclei_val"
    stage = DetectionStage()
    assert (stage.dataset(cfg), stage.evaluation_data(cfg)) == ("nuclei_train", "nuclei_val")
    pretrain = load_config(str(CONFIG_DIR / "pretrain_vit_tiny_digits.py"), [])
    assert PretrainStage().evaluation_data(pretrain) == "embedded:digits-cls/val"
