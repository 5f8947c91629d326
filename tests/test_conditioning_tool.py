"""condinit-conditioning (tools/attention_conditioning.py) on a tiny lazy config: a ViT backbone behind
a detectron2-style forward."""

import csv
import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from table_text import unpadded

pytest.importorskip("detectron2.modeling.backbone.vit")

from condinit_det.commands.conditioning import measure  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread():
    # These problems are small: one thread avoids oversubscription on a shared CPU.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


TOOL = os.path.join(os.path.dirname(__file__), os.pardir, "tools", "attention_conditioning.py")

CONFIG = textwrap.dedent("""
    import torch
    from torch import nn
    from detectron2.config import LazyCall as L
    from detectron2.modeling.backbone.vit import ViT


    class TinyDetector(nn.Module):
        def __init__(self, backbone):
            super().__init__()
            self.backbone = backbone

        def forward(self, batched_inputs):
            return self.backbone(torch.stack([d["image"].float() / 255 for d in batched_inputs]))


    def tiny_batches(num_batches, size):
        g = torch.Generator().manual_seed(0)
        return [[{"image": torch.rand(3, size, size, generator=g) * 255} for _ in range(2)]
                for _ in range(num_batches)]


    model = L(TinyDetector)(backbone=L(ViT)(img_size=32, patch_size=8, embed_dim=16, depth=2, num_heads=2,
                                            window_size=2, window_block_indexes=[0], use_rel_pos=True,
                                            out_feature="last_feat"))
    dataloader = dict(test=L(tiny_batches)(num_batches=2, size=32))
    condinit = dict(arm="default", seed=0, include=None, exclude=None, options={})
    train = dict(seed=0, output_dir="")
""")


def _tool():
    spec = importlib.util.spec_from_file_location("attention_conditioning_tool", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def config_file(tmp_path):
    path = tmp_path / "tiny_vit.py"
    path.write_text(CONFIG)
    return str(path)


def test_tool_all_arms_writes_tables(tmp_path, config_file, capsys):
    out = tmp_path / "out"
    rows = measure(
        [
            "--config-file",
            config_file,
            "model.backbone.num_heads=4",  # an override among the flags
            "--arm",
            "all",
            "--output",
            str(out),
            "--max-tokens",
            "4",
            "--tol",
            "1e-6",
        ]
    )
    printed = capsys.readouterr().out
    assert [(r["arm"], r["site"]) for r in rows] == [
        (arm, f"backbone.blocks.{i}.attn") for arm in ("default", "mimetic", "conditioned") for i in (0, 1)
    ]
    assert all(r["num_heads"] == 4 and r["tokens"] == 4 and r["converged"] for r in rows)
    assert all(math.isfinite(r["kappa"]) and r["kappa"] >= 1 and r["bound"] > 0 for r in rows)
    cond = [r for r in rows if r["arm"] == "conditioned"]
    for r in cond:  # every head block is semi-orthogonal, W_V the rectangular identity
        assert r["kappa_wq_heads"] + r["kappa_wk_heads"] + r["kappa_wv_heads"] == pytest.approx([1] * 12, abs=1e-5)
        assert r["kappa_wv"] == pytest.approx(1, abs=1e-5)
    assert "stride 2" in rows[1]["reduction"]
    with open(out / "attention_conditioning.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == 6 and table[0]["arm"] == "default"
    assert float(table[5]["kappa"]) == pytest.approx(rows[5]["kappa"])
    md = (out / "attention_conditioning.md").read_text()
    assert md.count("\n") == 8 and "| conditioned | backbone.blocks.1.attn |" in unpadded(md) and md in printed
    saved = json.loads((out / "attention_conditioning.json").read_text())
    assert len(saved["rows"]) == 6


def test_tool_exact_matches_matrix_free_and_rejects_bad_input(config_file, capsys):
    common = ["--config-file", config_file, "--arm", "mimetic", "--max-tokens", "4", "--sites", "*.blocks.1.*"]
    exact = measure(common + ["--method", "exact"])
    free = measure(common + ["--tol", "1e-6", "--method", "matrix_free"])
    assert len(exact) == len(free) == 1 and exact[0]["method"] == "exact"
    assert free[0]["kappa"] == pytest.approx(exact[0]["kappa"], rel=0.02)
    with pytest.raises(ValueError, match="matches no attention site"):
        measure(["--config-file", config_file, "--arm", "default", "--sites", "nothing.*"])
    with pytest.raises(ValueError, match="does not exist"):
        measure(["--config-file", config_file + ".missing"])
    # the command line: one error line, exit status 2
    tool = _tool()
    capsys.readouterr()
    for argv, message in (
        (["--arm", "default", "--sites", "nothing.*"], "matches no attention site"),
        (["--config-file", config_file + ".missing"], "does not exist"),
    ):
        argv = argv if argv[0] == "--config-file" else ["--config-file", config_file, *argv]
        assert tool.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and err.count("\n") == 0 and ": error: " in err, err


def test_tool_ends_with_one_error_line_naming_the_alternative(tmp_path, config_file):
    # One head's factor (4 tokens x 8 channels by 3 x 8 x 4: 32 x 96) does not fit 1000 entries: one line, no
    # traceback.
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run(
        [
            sys.executable,
            TOOL,
            "--config-file",
            config_file,
            "--arm",
            "default",
            "--max-tokens",
            "4",
            "--sites",
            "*.blocks.1.*",
            "--method",
            "exact",
            "--max-entries",
            "1000",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "attention_conditioning.py: error: exact per-head conditioning of attention site "
        "'backbone.blocks.1.attn' would form a 3.07e+03-entry matrix"
    )
    assert "above max_entries=1e+03; use method='matrix_free'" in last
    from condinit_det.commands.conditioning import error_line

    assert "can't allocate" in error_line(
        RuntimeError("DefaultCPUAllocator: can't allocate memory")
    ) and "--method matrix_free" in error_line(MemoryError())
