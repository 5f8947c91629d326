"""The digits demo: its two configs (pretraining on digits-cls, Mask R-CNN fine-tuning on digits-det) and
``make demo-digits``, whose three commands the slow test runs as the Makefile writes them, at tiny size."""

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from coco_layout import small_digits_cls
from forked_tool import run_tool

ROOT = Path(__file__).resolve().parents[1]
PRETRAIN = "configs/demo/pretrain_vit_tiny_digits.py"
FINETUNE = "configs/demo/mask_rcnn_vit_tiny_digits_finetune.py"
ARMS = ("default", "mimetic", "conditioned", "scale_matched")  # the paper's three and the control


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A $CONDINIT_DATA for this module (the configs generate their datasets there when loaded)."""
    return tmp_path_factory.mktemp("condinit_data")


def _load_configs(data_dir, monkeypatch):
    from detectron2.config import LazyConfig

    from condinit_det.pretrain import load_config

    monkeypatch.setenv("CONDINIT_DATA", str(data_dir))
    return load_config(str(ROOT / PRETRAIN)), LazyConfig.load(str(ROOT / FINETUNE))


def test_configs_read_the_digits_and_share_the_trunk(data_dir, monkeypatch):
    from detectron2.config import LazyConfig

    from condinit_det.data import DIGIT_CLASSES, DIGITS_DATASET_NAMES

    pre, det = _load_configs(data_dir, monkeypatch)
    shapes_pre = LazyConfig.load(str(ROOT / "configs/demo/pretrain_vit_tiny.py"))
    shapes_det = LazyConfig.load(str(ROOT / "configs/demo/mask_rcnn_vit_tiny_finetune.py"))
    # Pretraining: the digits, 10 classes, no mirrored digits; the model and optimizer of the shapes demo.
    assert pre.data.root == "embedded:digits-cls" and pre.data.num_classes == len(DIGIT_CLASSES) == 10
    assert pre.augment.hflip == 0.0 and pre.augment.get("vflip", 0.0) == 0.0
    assert pre.model == shapes_pre.model and pre.optimizer == shapes_pre.optimizer
    # Fine-tuning: digits-det's two splits, 10 classes, no flips; the shapes demo's detector otherwise.
    assert det.dataloader.train.dataset.names == DIGITS_DATASET_NAMES[0] == "condinit_digits_train"
    assert det.dataloader.test.dataset.names == DIGITS_DATASET_NAMES[1] == "condinit_digits_val"
    assert det.model.roi_heads.num_classes == 10
    assert det.dataloader.train.mapper.augmentations == []
    net, shapes_net = det.model.backbone.net, shapes_det.model.backbone.net
    assert {k: v for k, v in net.items() if k != "norm_layer"} == {
        k: v for k, v in shapes_net.items() if k != "norm_layer"
    }
    assert net.norm_layer.keywords == shapes_net.norm_layer.keywords == {"eps": 1e-6}
    # A shorter schedule (one seed of `make demo-digits` within 15 minutes), warmup and kappa points kept in step.
    assert (det.train.max_iter, det.train.eval_period) == (240, shapes_det.train.eval_period)
    assert det.lr_multiplier.warmup_length * det.train.max_iter == pytest.approx(
        shapes_det.lr_multiplier.warmup_length * shapes_det.train.max_iter
    )
    assert det.train.max_iter % det.condinit_analysis.period == 0
    # The detector's ViT is the pretrained classifier's trunk, and each arm starts from its own pretraining run.
    kwargs = pre.model.kwargs
    assert (kwargs.patch_size, kwargs.embed_dim, kwargs.depth, kwargs.num_heads) == (
        net.patch_size,
        net.embed_dim,
        net.depth,
        net.num_heads,
    )
    assert net.pretrain_img_size == pre.data.img_size == kwargs.img_size
    assert det.train.init_checkpoint == pre.train.output_dir.removeprefix("./") + "/{arm}/seed{seed}"


def test_the_evaluator_reads_the_digits(data_dir, monkeypatch):
    """Loading the fine-tuning config registers digits-det, so the evaluator finds its split by name."""
    from detectron2.config import instantiate
    from detectron2.data import MetadataCatalog

    _, det = _load_configs(data_dir, monkeypatch)
    evaluator = instantiate(det.dataloader.evaluator)
    meta = MetadataCatalog.get("condinit_digits_val")
    assert meta.thing_classes == [str(d) for d in range(10)]
    assert meta.json_file == str(data_dir / "digits-det-v2" / "annotations" / "instances_val.json")
    assert len(evaluator._coco_api.getImgIds()) == 64


def make_commands(target="demo-digits", **variables):
    """The commands ``make <target>`` runs (``make -n``), each as a word list; the venv step left out."""
    assigned = [f"{k}={v}" for k, v in variables.items()]
    out = subprocess.run(
        ["make", "-n", "-s", target, "PY=python", *assigned], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    lines = out.replace("\\\n", " ").splitlines()
    return [shlex.split(line) for line in lines if line.strip() and "setup_env.sh" not in line]


def test_make_demo_digits_trains_every_arm_of_both_stages():
    commands = make_commands(SEEDS="0,1,2", DIGITS_OUTPUT="out/d")
    assert [c[:2] for c in commands] == [
        ["python", "tools/pretrain_net.py"],
        ["python", "tools/train_net.py"],
        ["python", "tools/compare_arms.py"],
    ]
    pretrain, finetune, compare = commands
    for command, config in ((pretrain, PRETRAIN), (finetune, FINETUNE)):
        assert command[command.index("--config-file") + 1] == config
        assert command[command.index("--arm") + 1] == "all,scale_matched"
        assert command[command.index("--seeds") + 1] == "0,1,2"
    assert "train.output_dir=out/d/pretrain" in pretrain and "train.output_dir=out/d/finetune" in finetune
    assert "train.init_checkpoint='out/d/pretrain/{arm}/seed{seed}'" in finetune
    assert compare[2:] == ["out/d/pretrain", "out/d/finetune", "--output", "out/d/report"]
    assert make_commands()[0][make_commands()[0].index("--seeds") + 1] == "0"  # one seed by default


def run_demo_digits(work: Path) -> Path:
    """The three commands of ``make demo-digits`` as written, in ``work``, with tiny data and schedules appended
    (one epoch of the first images of digits-cls, one fine-tuning step); returns ``work``. Run once per test run by
    the ``demo_digits_run`` fixture (conftest.py), which this module's test and the every config end to end test
    read."""
    data_dir = work / "condinit_data"
    tiny = small_digits_cls(work / "digits-cls", {"train": 2, "val": 1})
    extra = {
        "tools/pretrain_net.py": [
            f"data.root={tiny}",
            "train.epochs=1",
            "scheduler.warmup_epochs=0",
            "train.batch_size=8",
            "train.eval_batch_size=10",
            "train.workers=0",
        ],
        "tools/train_net.py": [
            "train.max_iter=1",
            "train.eval_period=1",
            "condinit_analysis.period=0",
            "dataloader.train.total_batch_size=2",
        ],
        "tools/compare_arms.py": ["--bootstrap", "50"],
    }
    env = dict(os.environ, CONDINIT_DATA=str(data_dir), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    for words in make_commands():
        tool = words[1]
        argv = [str(ROOT / w) if w.startswith("configs/") else w for w in words[2:]] + extra[tool]
        proc = run_tool(ROOT / tool, *argv, cwd=work, env=env, timeout=900)
        assert proc.returncode == 0, f"{' '.join(words)}\n{proc.stderr[-5000:]}"
    return work


@pytest.mark.slow
@pytest.mark.e2e
def test_make_demo_digits_end_to_end_at_tiny_size(demo_digits_run):
    """``make demo-digits`` at tiny size (:func:`run_demo_digits`): every arm pretrains on the digits, each detector
    starts from its own arm's run, and the report holds both stages."""
    from condinit_det.records.results import ResultsFile

    tmp_path = demo_digits_run
    base = tmp_path / "output" / "demo_digits"
    for arm in ARMS:
        own = base / "pretrain" / arm / "seed0"
        assert [r["epoch"] for r in ResultsFile(str(own)).records("cls")] == [1]
        run = base / "finetune" / arm / "seed0"
        final = [r for r in ResultsFile(str(run)).records("ap") if r["iteration"] == 1]
        assert final and "bbox" in final[-1] and "segm" in final[-1]
        report = json.loads((run / "condinit_arm_report.json").read_text())
        started_from = os.path.normpath(os.path.join(tmp_path, report["init_checkpoint"]))
        assert os.path.dirname(started_from) == str(own), report["init_checkpoint"]
        assert report["sites"] and all(
            s["weights_from"].endswith(f"(pretrained with arm {arm})") for s in report["sites"]
        ), report["sites"]
    markdown = (base / "report" / "report.md").read_text()
    assert "## Classification pretraining" in markdown and "## Detection" in markdown
    assert all(arm in markdown for arm in ARMS)
