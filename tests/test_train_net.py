"""tools/train_net.py end to end on a tiny CPU config, and the arm-isolation guarantee."""
import json
import os
import subprocess
import sys

import pytest
import torch
from detectron2.config import instantiate
from detectron2.utils.env import seed_all_rng
from table_text import unpadded

from condinit_det.engine import DetectionStage
from condinit_det.engine.config import load_config, prepare_config
from condinit_det.engine.train import build_model
from condinit_det.init import PAPER_ARMS as ARMS
from condinit_det.init import find_attention
from condinit_det.launch.arguments import build_parser
from condinit_det.launch.experiment import execute, plan_experiment
from condinit_det.records.results import ResultsFile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "tests", "tiny_train_config.py")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")


def _train_net(tmp_path, *argv):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, TRAIN_NET, "--config-file", CONFIG, *argv],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout + proc.stderr


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
        model, report = build_model(cfg)
        assert report.arm == arm
        batch = next(iter(instantiate(cfg.dataloader.train)))
        built[arm] = (model.state_dict(), batch, _attention_names(model))
    (sd_a, batch_a, attn), (sd_b, batch_b, _) = built["default"], built["conditioned"]
    assert len(attn) == 8  # two blocks x (qkv, proj) x (weight, bias)
    assert sd_a.keys() == sd_b.keys()
    for name in sd_a:
        if name not in attn:
            assert torch.equal(sd_a[name], sd_b[name]), name
    assert not torch.equal(sd_a["backbone.net.blocks.0.attn.qkv.weight"],
                           sd_b["backbone.net.blocks.0.attn.qkv.weight"])
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
    with pytest.raises(ValueError, match="Unknown arm"):
        prepare_config(load_config(CONFIG, []), arm="orthogonal")


@pytest.mark.slow
def test_train_then_arm_all_with_resume(tmp_path):
    exp = tmp_path / "exp"
    # 1. One arm: a run goes to <output_dir>/<arm>/seed<k>/, the layout --arm all uses.
    run = exp / "conditioned" / "seed0"
    log = _train_net(tmp_path, "--arm", "conditioned", f"train.output_dir={exp}",
                     "train.max_iter=2", "train.eval_period=1")
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
    log = _train_net(tmp_path, "--arm", "all", "--resume", f"train.output_dir={exp}",
                     "train.max_iter=2", "train.eval_period=1")
    assert log.count("already finished") == 1
    assert ResultsFile(run).records("ap") == recs
    for arm in ARMS:
        arm_recs = ResultsFile(exp / arm / "seed0").records("ap")
        assert [(r["iteration"], r["arm"], r["seed"]) for r in arm_recs] == [(1, arm, 0), (2, arm, 0)]
        with open(exp / arm / "seed0" / "condinit_arm_report.json") as f:
            assert json.load(f)["arm"] == arm
    report = exp / "report"
    assert {"report.md", "summary.csv", "curves.csv", "bbox_ap.png", "segm_ap.png"} <= set(os.listdir(report))
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
    _train_net(tmp_path, "--arm", "all", "--resume", f"train.output_dir={exp}",
               "train.max_iter=3", "train.eval_period=1")
    for arm in ARMS:
        after = ResultsFile(exp / arm / "seed0").records("ap")
        assert [r["iteration"] for r in after] == [1, 2, 3]
        assert after[:2] == before[arm]
        assert len([m for m in _metrics(exp / arm / "seed0") if "bbox/AP" in m]) == 3
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


def test_yacs_config_path(tmp_path):
    torch.set_num_threads(1)
    load_config(CONFIG, [])  # registers the tiny datasets in this process
    yaml_file = tmp_path / "tiny.yaml"
    yaml_file.write_text(_TINY_YACS)
    args = build_parser().parse_args(
        ["--config-file", str(yaml_file), "--arm", "mimetic", "OUTPUT_DIR", str(tmp_path / "yacs_run")])
    assert execute(plan_experiment(DetectionStage(), args)) == 0
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
    from condinit_det.utils.checkpoint_io import load_safetensors

    _, meta = load_safetensors(str(out / "model_final.safetensors"))  # the shareable copy, with the run's metadata
    assert (meta["format"], meta["arm"], meta["seed"], meta["iteration"]) == (
        "condinit_det.detection/v1", "mimetic", 0, 1
    )


def test_init_checkpoint_override_is_detected_per_site(tmp_path):
    from detectron2.checkpoint import DetectionCheckpointer

    from condinit_det.engine.arm_report import AttentionSnapshot, weights_from

    torch.set_num_threads(1)
    cfg = prepare_config(load_config(CONFIG, []), arm="conditioned", output_dir=str(tmp_path))
    model, report = build_model(cfg)
    # a checkpoint holding only block 0's attention (as a partial pretrained backbone would)
    ckpt = {
        k: torch.zeros_like(v) for k, v in model.state_dict().items() if k.startswith("backbone.net.blocks.0.attn.")
    }
    torch.save({"model": ckpt}, tmp_path / "partial.pth")
    snapshot = AttentionSnapshot(model)
    assert sorted(snapshot.names_by_site) == ["backbone.net.blocks.0.attn", "backbone.net.blocks.1.attn"]
    DetectionCheckpointer(model).load(str(tmp_path / "partial.pth"))
    overwritten = snapshot.overwritten(model)
    assert overwritten == ["backbone.net.blocks.0.attn"]
    assert weights_from(report, overwritten, "partial.pth", None) == {
        "backbone.net.blocks.0.attn": "checkpoint partial.pth", "backbone.net.blocks.1.attn": "arm conditioned"}
