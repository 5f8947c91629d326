"""condinit_det.model_zoo: configs by name, and zoo:<name> on every command line."""

import os
import re

import pytest

pytest.importorskip("detectron2.config")

from detectron2.config import CfgNode, LazyConfig  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from condinit_det import model_zoo  # noqa: E402
from condinit_det.engine.config import load_config as load_detection_config  # noqa: E402
from condinit_det.pretrain import load_config as load_pretrain_config  # noqa: E402
from condinit_det.utils.errors import UsageError  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")


def _files_under(folder):
    found = set()
    for path, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found.update(os.path.relpath(os.path.join(path, f), folder).replace(os.sep, "/") for f in files)
    return found


def test_names_are_the_checkout_configs():
    assert model_zoo.configs_root() == CONFIGS  # a checkout reads configs/ in place
    names = model_zoo.list_configs()
    assert names == sorted(n for n in _files_under(CONFIGS) if not n.startswith("common/"))
    assert {
        "COCO/mask_rcnn_xcit_s12_p16_3x_in1k.py",
        "demo/mask_rcnn_vit_tiny.py",
        "ImageNet/deit_b_300ep.py",
        "yacs/mask_rcnn_xcit_s12_3x.yaml",
    } <= set(names)
    assert model_zoo.get_config_file("demo/mask_rcnn_vit_tiny.py") == os.path.join(
        CONFIGS, "demo", "mask_rcnn_vit_tiny.py"
    )


def test_get_config_loads_relative_imports_and_yacs():
    # COCO/mask_rcnn_swin_b_3x_in1k.py imports .mask_rcnn_swin_b_3x, which imports .mask_rcnn_swin_t_3x,
    # which imports ..common.*
    cfg = model_zoo.get_config("COCO/mask_rcnn_swin_b_3x_in1k.py")
    assert isinstance(cfg, DictConfig)
    assert cfg.model.backbone.bottom_up.embed_dim == 128 and cfg.condinit.arm == "default"
    path = os.path.join(CONFIGS, "COCO", "mask_rcnn_swin_b_3x_in1k.py")
    assert LazyConfig.to_py(cfg) == LazyConfig.to_py(LazyConfig.load(path))
    yacs = model_zoo.get_config("yacs/mask_rcnn_vit_tiny_embedded.yaml")
    assert isinstance(yacs, CfgNode) and yacs.MODEL.CONDINIT.ARM == "default" and yacs.MODEL.VIT.EMBED_DIM == 96


def test_bad_names_say_what_is_accepted(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"did you mean demo/mask_rcnn_vit_tiny\.py"):
        model_zoo.get_config_file("demo/mask_rcnn_vit_tin.py")
    for outside in ("../setup.py", os.path.join(ROOT, "setup.py"), "", "demo"):
        with pytest.raises(FileNotFoundError, match="is not a model-zoo config.*available: COCO/"):
            model_zoo.get_config_file(outside)
    # a command line's --config-file: a path, or zoo:<name>
    assert model_zoo.resolve_config_file("zoo:demo/pretrain_vit_tiny.py") == os.path.join(
        CONFIGS, "demo", "pretrain_vit_tiny.py"
    )
    monkeypatch.chdir(tmp_path)  # outside the checkout, a checkout path is missing: the zoo name is suggested
    with pytest.raises(FileNotFoundError, match="for the model-zoo config write zoo:demo/mask_rcnn_vit_tiny.py"):
        model_zoo.resolve_config_file("configs/demo/mask_rcnn_vit_tiny.py")


def test_tools_take_zoo_names(tmp_path):
    by_name = load_detection_config("zoo:demo/mask_rcnn_vit_tiny.py", ["train.max_iter=3"])
    by_path = load_detection_config(os.path.join(CONFIGS, "demo", "mask_rcnn_vit_tiny.py"), ["train.max_iter=3"])
    assert LazyConfig.to_py(by_name) == LazyConfig.to_py(by_path) and by_name.train.max_iter == 3
    # a yacs config arrives as the lazy config its builders make, its overrides (KEY VALUE) applied
    yacs = load_detection_config("zoo:yacs/mask_rcnn_vit_tiny_embedded.yaml", ["SOLVER.MAX_ITER", "7"])
    assert isinstance(yacs, DictConfig) and yacs.train.max_iter == 7 and yacs.yacs.SOLVER.MAX_ITER == 7
    assert yacs.condinit.arm == "default" and yacs.condinit.include == ["backbone.net.*"]
    with pytest.raises(UsageError, match="is a yacs config|expected a lazy .py config"):
        load_pretrain_config("zoo:yacs/mask_rcnn_vit_tiny_embedded.yaml")
    with pytest.raises(UsageError, match="cannot apply overrides 'SOLVER.MAX_ITR 7': Non-existent key: SOLVER.MAX_ITR"):
        load_detection_config("zoo:yacs/mask_rcnn_vit_tiny_embedded.yaml", ["SOLVER.MAX_ITR", "7"])
    cfg = load_pretrain_config("zoo:demo/pretrain_vit_tiny.py", ["train.epochs=1"])
    assert cfg.train.epochs == 1
    wrong = (
        r"^--config-file: .demo/pretrain_vit_tiy.py. is not a model-zoo config "
        r".*did you mean demo/pretrain_vit_tiny"
    )
    with pytest.raises(UsageError, match=wrong):
        load_pretrain_config("zoo:demo/pretrain_vit_tiy.py")
    with pytest.raises(UsageError, match="does not exist; give a config file or a model-zoo name"):
        load_detection_config(str(tmp_path / "missing.py"))


def test_the_configs_page_lists_every_name():
    # docs/configs.md, section "Model-zoo names": every name of the zoo, and no name that is not in it.
    with open(os.path.join(ROOT, "docs", "configs.md")) as f:
        section = f.read().split("\n## Model-zoo names\n", 1)[1].split("\n## ", 1)[0]
    names = model_zoo.list_configs()
    for name in names:
        assert f"`{name}`" in section, name
    listed = re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE)
    assert sorted(listed) == sorted(names)
