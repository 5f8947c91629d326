"""tools/train_net.py end to end on a tiny CPU config, and the arm-isolation guarantee."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from detectron2.config import LazyConfig, instantiate
from detectron2.data import DatasetCatalog
from detectron2.structures import Boxes, Instances
from detectron2.utils.env import seed_all_rng
from forked_tool import run_tool
from PIL import Image
from table_text import unpadded

from condinit_det.engine import DetectionStage
from condinit_det.engine.config import CONDINIT_DEFAULTS, load_config, prepare_config
from condinit_det.engine.train import PREDICTIONS_FIGURE, save_predictions_figure, weights_from
from condinit_det.init import PAPER_ARMS as ARMS
from condinit_det.init import find_attention
from condinit_det.launch.arguments import build_parser
from condinit_det.launch.plan import plan_experiment
from condinit_det.launch.run import execute
from condinit_det.records.layout import RunSpec
from condinit_det.records.results import ResultsFile
from condinit_det.stage import RunOptions
from condinit_det.utils.errors import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "tests", "tiny_train_config.py")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")


def _train_net(tmp_path, *argv, python=None, config=CONFIG, both=True):
    """``python``: the interpreter's options, for a test of what a fresh ``python`` prints (else a forked one)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    if python is None:
        proc = run_tool(TRAIN_NET, "--config-file", config, *argv, cwd=tmp_path, env=env, timeout=600)
    else:
        command = [sys.executable, *python, TRAIN_NET, "--config-file", config, *argv]
        proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout + proc.stderr if both else proc


def _finished_run_files(run):
    """What every finished run leaves besides its records: a log without terminal colours that names its end,
    the environment it ran in, and the figure of its predictions."""
    log = (run / "log.txt").read_text()
    assert "\x1b[" not in log
    last = log.rstrip().splitlines()[-1]
    assert "INFO: Run ended at " in last and last.endswith(f"results in {run / 'results.json'}"), last
    (environment,) = ResultsFile(run).records("environment")
    assert environment["iteration"] == 0 and environment["torch"] == torch.__version__
    with Image.open(run / PREDICTIONS_FIGURE) as figure:  # two 64x64 test images, each a row of two 260-px panels
        assert figure.format == "PNG" and figure.size == (2 * 260, 2 * 260)


def _metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.json")) as f:
        return [json.loads(line) for line in f if line.strip()]


def _attention_names(model):
    names = set()
    for site in find_attention(model):
        for proj in site.projections.values():
            names.update(f"{site.name}.{p}" for p in (proj.weight, proj.bias) if p)
    return names


def test_arms_differ_only_in_attention_weights(tmp_path):
    torch.set_num_threads(1)
    built = {}
    for arm in ("default", "conditioned"):
        cfg = prepare_config(load_config(CONFIG, []), arm=arm, output_dir=str(tmp_path / arm))
        assert cfg.train.seed == 0 and cfg.condinit.seed == 0  # -1/absent -> 0; condinit follows
        seed_all_rng(cfg.train.seed)  # what default_setup does
        model = instantiate(cfg.model)
        assert model.condinit_report.arm == arm
        batch = next(iter(instantiate(cfg.dataloader.train)))
        built[arm] = (model.state_dict(), batch, _attention_names(model))
    (sd_a, batch_a, attn), (sd_b, batch_b, _) = built["default"], built["conditioned"]
    assert len(attn) == 8  # two blocks x (qkv, proj) x (weight, bias)
    assert sd_a.keys() == sd_b.keys()
    for name in sd_a:
        if name not in attn:
            assert torch.equal(sd_a[name], sd_b[name]), name
    assert not torch.equal(sd_a["backbone.net.blocks.0.attn.qkv.weight"], sd_b["backbone.net.blocks.0.attn.qkv.weight"])
    assert [d["image_id"] for d in batch_a] == [d["image_id"] for d in batch_b]
    for x, y in zip(batch_a, batch_b):
        assert torch.equal(x["image"], y["image"])
        assert torch.equal(x["instances"].gt_boxes.tensor, y["instances"].gt_boxes.tensor)


def test_bad_arguments(tmp_path):
    parser = build_parser()
    with pytest.raises(ValueError, match="'bogus' is not an arm; accepted: default, mimetic, conditioned"):
        plan_experiment(DetectionStage(), parser.parse_args(["--config-file", CONFIG, "--arm", "bogus"]))
    args = parser.parse_args(["--config-file", CONFIG, "--arm", "all", "--eval-only"])
    with pytest.raises(ValueError, match="eval-only"):
        plan_experiment(DetectionStage(), args)
    with pytest.raises(ValueError, match="does not exist"):
        load_config(str(tmp_path / "missing.py"))
    with pytest.raises(ValueError, match="condinit.arm='orthogonal' is not an arm; accepted: default, mimetic"):
        prepare_config(load_config(CONFIG, []), arm="orthogonal")


@pytest.mark.slow
def test_train_then_arm_all_with_resume(tmp_path):
    exp = tmp_path / "exp"
    # 1. One arm: a run goes to <output_dir>/<arm>/seed<k>/, the layout --arm all uses.
    run = exp / "conditioned" / "seed0"
    log = _train_net(
        tmp_path, "--arm", "conditioned", f"train.output_dir={exp}", "train.max_iter=2", "train.eval_period=1"
    )
    assert "eta:" in log  # progress with ETA
    recs = ResultsFile(run).records("ap")
    assert [r["iteration"] for r in recs] == [1, 2]
    assert all(r["arm"] == "conditioned" and r["seed"] == 0 and r["config"] == CONFIG for r in recs)
    assert all(r["bbox"]["AP"] is None or 0.0 <= r["bbox"]["AP"] <= 100.0 for r in recs)
    metrics = [m for m in _metrics(run) if "bbox/AP" in m]
    assert len(metrics) == 2 and all("segm/AP" in m for m in metrics)
    with open(run / "condinit_arm_report.json") as f:
        arm_report = json.load(f)
    assert arm_report["arm"] == "conditioned" and len(arm_report["sites"]) == 2
    for name in ("model_final.pth", "model_best.pth", "config.yaml", "log.txt"):
        assert (run / name).is_file(), name
    assert (run / "last_checkpoint").read_text().strip() == "model_final.pth"

    # 2. --arm all --resume: the finished arm is skipped and kept, the others are trained,
    #    then the report is written and printed.
    log = _train_net(
        tmp_path, "--arm", "all", "--resume", f"train.output_dir={exp}", "train.max_iter=2", "train.eval_period=1"
    )
    assert log.count("already finished") == 1
    assert ResultsFile(run).records("ap") == recs
    for arm in ARMS:
        arm_recs = ResultsFile(exp / arm / "seed0").records("ap")
        assert [(r["iteration"], r["arm"], r["seed"]) for r in arm_recs] == [(1, arm, 0), (2, arm, 0)]
        with open(exp / arm / "seed0" / "condinit_arm_report.json") as f:
            assert json.load(f)["arm"] == arm
    report = exp / "report"
    assert {"report.md", "summary.csv", "stats.csv", "bbox_ap.png", "segm_ap.png"} <= set(os.listdir(report))
    md = (report / "report.md").read_text()
    assert md in log  # printed at the end
    for arm in ARMS:
        assert f"| {arm} |" in unpadded(md)
    # each arm logged only into its own directory
    assert "arm 'mimetic'" in (exp / "mimetic" / "seed0" / "log.txt").read_text()
    assert "arm 'mimetic'" not in (exp / "default" / "seed0" / "log.txt").read_text()

    # 3. A longer schedule with --resume continues every arm from its checkpoint: no point lost
    #    or duplicated.
    before = {arm: ResultsFile(exp / arm / "seed0").records("ap") for arm in ARMS}
    _train_net(
        tmp_path, "--arm", "all", "--resume", f"train.output_dir={exp}", "train.max_iter=3", "train.eval_period=1"
    )
    for arm in ARMS:
        after = ResultsFile(exp / arm / "seed0").records("ap")
        assert [r["iteration"] for r in after] == [1, 2, 3]
        assert after[:2] == before[arm]
        # metrics.json holds what the resumed schedule writes up to its checkpoint (iteration 1) and after it: the
        # shorter schedule's final evaluation (written at iteration 2) stays in results.json alone.
        assert [m["iteration"] for m in _metrics(exp / arm / "seed0") if "bbox/AP" in m] == [0, 3]
    assert "| 3 |" in unpadded((report / "report.md").read_text())  # final iteration column


_TINY_YACS = """
MODEL:
  META_ARCHITECTURE: "GeneralizedRCNN"
  DEVICE: "cpu"
  MASK_ON: True
  PIXEL_MEAN: [127.0, 127.0, 127.0]
  PIXEL_STD: [60.0, 60.0, 60.0]
  BACKBONE: {NAME: "build_condinit_vit_backbone"}
  CONDINIT: {ARM: "default", SEED: 0}
  VIT: {IMG_SIZE: 64, PRETRAIN_IMG_SIZE: 64, PATCH_SIZE: 16, EMBED_DIM: 32, DEPTH: 2, NUM_HEADS: 2,
        MLP_RATIO: 2.0, DROP_PATH_RATE: 0.0, WINDOW_SIZE: 2, WINDOW_BLOCK_INDEXES: [0], USE_REL_POS: False}
  SIMPLE_FPN: {SCALE_FACTORS: [4.0, 2.0, 1.0, 0.5], SQUARE_PAD: 64}
  FPN: {OUT_CHANNELS: 16}
  ANCHOR_GENERATOR: {SIZES: [[8], [16], [32], [64], [128]]}
  RPN: {IN_FEATURES: ["p2", "p3", "p4", "p5", "p6"], BATCH_SIZE_PER_IMAGE: 32, PRE_NMS_TOPK_TRAIN: 100,
        PRE_NMS_TOPK_TEST: 100, POST_NMS_TOPK_TRAIN: 30, POST_NMS_TOPK_TEST: 20}
  ROI_HEADS: {NAME: "StandardROIHeads", IN_FEATURES: ["p2", "p3", "p4", "p5"], NUM_CLASSES: 2,
              BATCH_SIZE_PER_IMAGE: 32}
  ROI_BOX_HEAD: {NAME: "FastRCNNConvFCHead", NUM_CONV: 0, NUM_FC: 1, FC_DIM: 32, POOLER_RESOLUTION: 4}
  ROI_MASK_HEAD: {NAME: "MaskRCNNConvUpsampleHead", NUM_CONV: 1, CONV_DIM: 16, POOLER_RESOLUTION: 7}
DATASETS: {TRAIN: ["condinit_tiny_train"], TEST: ["condinit_tiny_val"]}
INPUT: {FORMAT: "RGB", MIN_SIZE_TRAIN: [64], MAX_SIZE_TRAIN: 64, MIN_SIZE_TEST: 64, MAX_SIZE_TEST: 64}
DATALOADER: {NUM_WORKERS: 0}
SOLVER: {OPTIMIZER: "ADAMW", IMS_PER_BATCH: 2, BASE_LR: 0.0001, MAX_ITER: 2, STEPS: [], WARMUP_ITERS: 1,
         CHECKPOINT_PERIOD: 1000}
TEST: {EVAL_PERIOD: 1}
SEED: -1
"""


def _plan_and_run(argv):
    args = build_parser().parse_args(argv)
    assert execute(plan_experiment(DetectionStage(), args)) == 0


def test_yacs_config_path(tmp_path):
    torch.set_num_threads(1)
    load_config(CONFIG, [])  # registers the tiny datasets in this process
    yaml_file = tmp_path / "tiny.yaml"
    yaml_file.write_text(_TINY_YACS)
    argv = [
        "--config-file",
        str(yaml_file),
        "--arm",
        "mimetic",
        "OUTPUT_DIR",
        str(tmp_path / "yacs_run"),
        "SOLVER.CHECKPOINT_PERIOD",
        "1",
    ]
    _plan_and_run(argv)
    out = tmp_path / "yacs_run" / "mimetic" / "seed0"
    recs = ResultsFile(out).records("ap")
    assert [(r["iteration"], r["arm"], r["seed"]) for r in recs] == [(1, "mimetic", 0), (2, "mimetic", 0)]
    assert recs[-1]["segm"] is not None and set(recs[-1]["bbox"]) >= {"AP", "AP50", "AP75"}
    with open(out / "condinit_arm_report.json") as f:
        report = json.load(f)
    assert report["arm"] == "mimetic" and len(report["sites"]) == 2
    assert len([m for m in _metrics(out) if "bbox/AP" in m]) == 2
    assert (out / "last_checkpoint").read_text().strip() == "model_final.pth"
    assert (out / "model_best.pth").is_file()
    _finished_run_files(out)
    from condinit_det.utils.checkpoint_io import read_safetensors_metadata

    meta = read_safetensors_metadata(str(out / "model_final.safetensors"))  # the shareable copy, with its metadata
    assert (meta["format"], meta["arm"], meta["seed"], meta["iteration"], meta["stage"]) == (
        "condinit_det.detection/v1",
        "mimetic",
        0,
        1,
        "detection",
    )

    # A run killed after its first iteration: --resume continues from that checkpoint
    (out / "model_final.pth").unlink()
    (out / "last_checkpoint").write_text("model_0000000.pth")
    results = json.loads((out / "results.json").read_text())
    results["records"] = [r for r in results["records"] if r["iteration"] < 2]
    (out / "results.json").write_text(json.dumps(results))
    _plan_and_run(["--resume", *argv])
    assert [r["iteration"] for r in ResultsFile(out).records("ap")] == [1, 2]
    assert [r["iteration"] for r in ResultsFile(out).records("environment")] == [0, 1]
    assert (out / "model_final.pth").is_file()

    # --eval-only files its record under the checkpoint's own arm, whatever the config's arm says
    weights = str(out / "model_final.pth")
    _plan_and_run(
        ["--config-file", str(yaml_file), "--eval-only", "MODEL.WEIGHTS", weights, "OUTPUT_DIR", str(tmp_path / "eval")]
    )
    (record,) = ResultsFile(tmp_path / "eval" / "default" / "seed0").records("eval")
    assert (record["arm"], record["stage"], record["checkpoint"], record["iteration"]) == (
        "mimetic",
        "detection",
        weights,
        2,
    )
    assert record["bbox"] == ResultsFile(out).records("ap")[-1]["bbox"]  # the same weights as the final evaluation
    # a checkpoint that names no arm is recorded under the config's, and the log says so
    bare = tmp_path / "bare.pth"
    torch.save({"model": torch.load(weights, weights_only=True)["model"]}, bare)
    _plan_and_run(
        [
            "--config-file",
            str(yaml_file),
            "--eval-only",
            "MODEL.WEIGHTS",
            str(bare),
            "OUTPUT_DIR",
            str(tmp_path / "eval_bare"),
        ]
    )
    run = tmp_path / "eval_bare" / "default" / "seed0"
    (record,) = ResultsFile(run).records("eval")
    assert record["arm"] == "default"
    assert f"{bare} does not name its arm: recorded under the config's arm 'default'" in (run / "log.txt").read_text()


@pytest.mark.slow
def test_lazy_run_console_and_files(tmp_path):
    """A run of the documented command prints no third-party deprecation notice, even with every warning shown."""
    proc = _train_net(
        tmp_path,
        "--arm",
        "conditioned",
        f"train.output_dir={tmp_path / 'exp'}",
        "train.max_iter=2",
        "train.eval_period=2",
        python=("-W", "default"),
        both=False,
    )
    noise = [
        line
        for line in proc.stderr.splitlines()
        if "DeprecationWarning" in line or "FutureWarning" in line or "deprecated" in line
    ]
    assert not noise, "\n".join(noise)
    assert "eta:" in proc.stdout and "\x1b[" not in (tmp_path / "exp" / "conditioned" / "seed0" / "log.txt").read_text()
    _finished_run_files(tmp_path / "exp" / "conditioned" / "seed0")


@pytest.mark.slow
def test_demo_console_is_quiet_with_loader_workers(tmp_path, monkeypatch):
    """The demo command prints no third-party notice on stderr: neither its own process (the kappa hook's first
    forward-mode derivative) nor its data-loader workers (fvcore's flips)."""
    # conftest gives each pytest-xdist worker's processes one CPU, which would leave the run no loader worker
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    proc = _train_net(
        tmp_path,
        f"train.output_dir={tmp_path / 'demo'}",
        "train.max_iter=2",
        "dataloader.train.num_workers=2",
        config=os.path.join(ROOT, "configs", "demo", "mask_rcnn_vit_tiny.py"),
        python=(),
        both=False,
    )
    saved = LazyConfig.load(str(tmp_path / "demo" / "default" / "seed0" / "config.yaml"))
    assert saved.dataloader.train.num_workers == 2  # read back: YAML wraps long lines where it likes
    assert "Warning" not in proc.stderr, proc.stderr


def test_a_run_of_either_stage_keeps_third_party_notices_off_its_console():
    """Both stages start a run with run_logging: its filters hold in the process and the loader workers it forks."""
    import warnings

    from condinit_det.utils.logs import run_logging

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_logging(None, rank=0)
        for text, category in (
            ("`torch.jit.script` is deprecated. Please switch to `torch.compile`", FutureWarning),
            ("The given NumPy array is not writable, and PyTorch does not support", UserWarning),
            ("a notice of our own", UserWarning),
        ):
            warnings.warn(text, category, stacklevel=1)
    assert [str(w.message) for w in caught] == ["a notice of our own"]


def test_a_config_without_condinit_node_gets_its_defaults(tmp_path):
    config = os.path.join(ROOT, "tests", "tiny_no_condinit_config.py")
    cfg = load_config(config, [])
    assert cfg.condinit == CONDINIT_DEFAULTS
    torch.manual_seed(0)
    assert instantiate(cfg.model).condinit_report.arm == "default"  # the armed node resolves its ${condinit}
    args = build_parser().parse_args(
        ["--config-file", config, "--arm", "mimetic", "--dry-run", f"train.output_dir={tmp_path}"]
    )
    experiment = plan_experiment(DetectionStage(), args)
    assert [spec.arm for spec in experiment.runs] == ["mimetic"]


def test_missing_keys_and_cuda_are_one_line_errors(tmp_path, monkeypatch):
    config = tmp_path / "no_max_iter.py"
    config.write_text(
        f"from detectron2.config import LazyConfig\n_base = LazyConfig.load({CONFIG!r})\n"
        "model, dataloader, optimizer = _base.model, _base.dataloader, _base.optimizer\n"
        "lr_multiplier, train, condinit = _base.lr_multiplier, _base.train, _base.condinit\n"
        "del train['max_iter']\n"
    )
    args = build_parser().parse_args(["--config-file", str(config), "--dry-run"])
    with pytest.raises(UsageError, match=r"^.*no_max_iter.py: the config has no train.max_iter; a detection config"):
        plan_experiment(DetectionStage(), args)

    # train.device=cuda without CUDA: refused before any model is built
    from condinit_det.engine import stage

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(stage, "check_arm_sites", lambda cfg: pytest.fail("the model was built"))
    cfg = load_config(CONFIG, ["train.device=cuda"])
    runs = [(RunSpec("default", 0), DetectionStage().configure_run(cfg, RunSpec("default", 0), str(tmp_path)))]
    with pytest.raises(
        UsageError, match="train.device='cuda' .* but no CUDA device is available; pass train.device=cpu"
    ):
        DetectionStage().check(RunOptions(), runs)


def test_init_checkpoint_override_is_detected_per_site(tmp_path):
    from condinit_det.engine.checkpoint import RunCheckpointer

    torch.set_num_threads(1)
    cfg = prepare_config(load_config(CONFIG, []), arm="conditioned", output_dir=str(tmp_path))
    model = instantiate(cfg.model)
    # a checkpoint holding only block 0's attention (as a partial pretrained backbone would)
    ckpt = {
        k: torch.zeros_like(v) for k, v in model.state_dict().items() if k.startswith("backbone.net.blocks.0.attn.")
    }
    torch.save({"model": ckpt}, tmp_path / "partial.pth")
    checkpointer = RunCheckpointer(model)
    checkpointer.load(str(tmp_path / "partial.pth"))
    assert checkpointer.loaded == set(ckpt)
    assert weights_from(model.condinit_report, model, checkpointer.loaded, "partial.pth", None) == {
        "backbone.net.blocks.0.attn": "checkpoint partial.pth",
        "backbone.net.blocks.1.attn": "arm conditioned",
    }


class _NoDetections(torch.nn.Module):
    """A stand-in detector that finds nothing."""

    def forward(self, batched_inputs):
        empty = {"pred_boxes": Boxes(torch.zeros(0, 4)), "scores": torch.zeros(0), "pred_classes": torch.zeros(0)}
        return [{"instances": Instances((i["height"], i["width"]), **empty)} for i in batched_inputs]


def test_predictions_figure_draws_the_ground_truth_beside_the_predictions(tmp_path):
    cfg = load_config(CONFIG, [])
    save_predictions_figure(cfg, _NoDetections(), str(tmp_path / PREDICTIONS_FIGURE))
    figure = np.asarray(Image.open(tmp_path / PREDICTIONS_FIGURE).convert("RGB")).astype(int)
    # a row per test image (two of 64x64), each drawn 4x to 256 px with a 2-px margin: ground truth, predictions
    assert figure.shape == (2 * 260, 2 * 260, 3)
    for row, record in enumerate(DatasetCatalog.get("condinit_tiny_val")):
        image = np.kron(np.asarray(Image.open(record["file_name"]).convert("RGB")), np.ones((4, 4, 1), int))
        truth, found = (figure[row * 260 + 2 : row * 260 + 258, col * 260 + 2 : col * 260 + 258] for col in (0, 1))
        assert np.array_equal(found, image)  # nothing predicted, nothing drawn
        assert np.abs(truth - image).max() > 100  # its two objects' boxes, masks and class names
