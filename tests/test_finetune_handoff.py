"""Each arm's detector starts from that arm's own pretrained backbone (train.init_checkpoint with {arm})."""

import json
import os

import pytest
import timm
import torch
from forked_tool import run_tool

from condinit_det.init import ARMS, apply_init

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "tests", "tiny_train_config.py")
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
# The trunk of tests/tiny_train_config.py as a timm classifier (what tools/pretrain_net.py saves).
TIMM_NAME = "vit_tiny_patch16_224"
TIMM_KWARGS = dict(patch_size=16, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, qkv_bias=True, img_size=64)


def _pretrain_checkpoints(root):
    """``root/<arm>/seed0/model_final.pth`` in the pretraining format, each with its arm applied."""
    weights = {}
    for arm in ARMS:
        torch.manual_seed(0)
        model = timm.create_model(TIMM_NAME, pretrained=False, num_classes=4, **TIMM_KWARGS)
        apply_init(model, arm, seed=7)
        run = root / arm / "seed0"
        run.mkdir(parents=True)
        torch.save(
            {
                "format": "condinit_det.pretrain/v1",
                "model": model.state_dict(),
                "weights": "model",
                "timm_model": TIMM_NAME,
                "model_kwargs": TIMM_KWARGS,
                "num_classes": 4,
                "img_size": 64,
                "arm": arm,
                "seed": 0,
                "epoch": 1,
            },
            run / "model_final.pth",
        )
        weights[arm] = model.state_dict()
    return weights


@pytest.mark.slow
def test_each_arm_fine_tunes_from_its_own_pretraining(tmp_path):
    pretrained = _pretrain_checkpoints(tmp_path / "pretrain")
    exp = tmp_path / "finetune"
    # lr 0: the weights after one step are the weights the run started from.
    proc = run_tool(
        TRAIN_NET,
        "--config-file",
        CONFIG,
        "--arm",
        ",".join(ARMS),
        f"train.output_dir={exp}",
        f"train.init_checkpoint='{tmp_path / 'pretrain' / '{arm}' / 'seed{seed}'}'",
        "train.max_iter=1",
        "train.eval_period=1",
        "optimizer.lr=0.0",
        "optimizer.weight_decay=0.0",
        cwd=tmp_path,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    qkv = {}
    for arm in ARMS:
        run = exp / arm / "seed0"
        final = torch.load(run / "model_final.pth", map_location="cpu", weights_only=True)["model"]
        for block in range(2):
            for name in ("qkv.weight", "qkv.bias", "proj.weight"):
                ours = final[f"backbone.net.blocks.{block}.attn.{name}"]
                assert torch.equal(ours, pretrained[arm][f"blocks.{block}.attn.{name}"]), (arm, block, name)
        qkv[arm] = final["backbone.net.blocks.0.attn.qkv.weight"]
        report = json.loads((run / "condinit_arm_report.json").read_text())
        assert report["init_checkpoint"].endswith(f"pretrain/{arm}/seed0/model_final.pth")
        assert all(s["weights_from"].endswith(f"(pretrained with arm {arm})") for s in report["sites"])
        assert f"pretrained with arm '{arm}'" in (run / "log.txt").read_text()
    assert not torch.equal(qkv["default"], qkv["mimetic"]) and not torch.equal(qkv["mimetic"], qkv["conditioned"])
