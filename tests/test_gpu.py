"""On a CUDA device: the arms (float32 / float16 / bfloat16, TF32 on and off), detection training with
AMPTrainer + evaluation + resume, pretraining with AMP and EMA, 2-GPU NCCL DDP with the replica check.

Marked ``gpu``; skipped where no CUDA device is available. ``make gpu-check`` runs them with a verdict
per test (tools/gpu_check.py).
"""

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from condinit_det.init import apply_init, find_attention
from condinit_det.records.results import ResultsFile

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make gpu-check)"),
]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_NET = os.path.join(ROOT, "tools", "train_net.py")
PRETRAIN_NET = os.path.join(ROOT, "tools", "pretrain_net.py")
DETECTION_DEMO = os.path.join(ROOT, "configs", "demo", "mask_rcnn_vit_tiny.py")
PRETRAIN_DEMO = os.path.join(ROOT, "configs", "demo", "pretrain_vit_tiny.py")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@pytest.fixture(params=[False, True], ids=["tf32_off", "tf32_on"])
def tf32(request):
    """TF32 for CUDA float32 matmuls as the user set it; the arms must not depend on it."""
    before = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32" if request.param else "ieee"
    yield request.param
    torch.backends.cuda.matmul.fp32_precision = before


def _model(dtype, device):
    torch.manual_seed(0)
    return nn.Sequential(nn.MultiheadAttention(384, 6), nn.MultiheadAttention(384, 6)).to(device=device, dtype=dtype)


def _head_blocks(w, dim, heads):
    dh = dim // heads
    return [w[r * dim + h * dh : r * dim + (h + 1) * dh] for r in range(2) for h in range(heads)]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("arm", ["conditioned", "mimetic"])
def test_arm_on_cuda_matches_the_cpu(arm, dtype, tf32):
    dt = DTYPES[dtype]
    gpu, cpu, ref = _model(dt, "cuda"), _model(dt, "cpu"), _model(torch.float64, "cpu")
    for m in (gpu, cpu, ref):
        apply_init(m, arm, seed=0)
    assert torch.backends.cuda.matmul.fp32_precision == ("tf32" if tf32 else "ieee")  # restored
    eps = torch.finfo(dt).eps
    for site_gpu, site_cpu, site_ref in zip(find_attention(gpu), find_attention(cpu), find_attention(ref)):

        def weights(site, role):
            return site.weight(role).detach().cpu().double()

        # The same values on both devices (signed singular vectors) up to the rounding of the working
        # precision and of the parameters' dtype; a sign flip would be off by twice the value. Mimetic's
        # V/O factorization runs in float32 for these dtypes, where singular values closer than its
        # rounding leave their vectors free to rotate within the cluster: V/O is compared by its product.
        for role in ("q", "k", "v", "o") if arm == "conditioned" else ("q", "k"):
            a, b = weights(site_gpu, role), weights(site_cpu, role)
            tol = max(1e-5 if arm == "conditioned" else 1e-4, 2 * eps) * float(b.abs().max())
            # assert_close calls msg before it returns; the default binds this iteration's role.
            torch.testing.assert_close(a, b, rtol=0, atol=tol, msg=lambda m, role=role: f"{role}: {m}")
        if arm == "mimetic":
            p_gpu, p_cpu = (weights(site, "v").T @ weights(site, "o").T for site in (site_gpu, site_cpu))
            tol = 1e-5 if dt == torch.float32 else 8 * eps
            assert torch.linalg.matrix_norm(p_gpu - p_cpu) <= tol * torch.linalg.matrix_norm(p_cpu), dtype
        w = site_gpu.weight("q").detach().cpu().double()
        if arm == "conditioned":
            w_qk = torch.cat([w, site_gpu.weight("k").detach().cpu().double()])
            for block in _head_blocks(w_qk, 384, 6):  # README: within 1e-5 of the gain in float32
                s = torch.linalg.svdvals(block)
                assert (s - 1).abs().max() <= (1e-5 if dt == torch.float32 else 4 * eps), dtype
            assert torch.equal(site_gpu.weight("v").detach().cpu().double(), torch.eye(384, dtype=torch.float64))
        else:  # README: products within 1e-4 of the float64 reference (float32: 1e-6 after rounding)
            k = site_gpu.weight("k").detach().cpu().double()
            qr, kr = site_ref.weight("q").detach(), site_ref.weight("k").detach()
            for h in range(6):
                rows = slice(h * 64, (h + 1) * 64)
                p, pr = w[rows].T @ k[rows], qr[rows].T @ kr[rows]
                tol = 1e-4 if dt == torch.float32 else 8 * eps
                assert torch.linalg.matrix_norm(p - pr) <= tol * torch.linalg.matrix_norm(pr), (dtype, h)


def _run(tool, *argv, cwd):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, tool, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout + proc.stderr


def test_detection_amp_train_evaluate_resume(tmp_path):
    out = tmp_path / "det"
    common = [
        "--config-file",
        DETECTION_DEMO,
        "--arm",
        "conditioned",
        "train.device=cuda",
        "train.amp.enabled=True",
        f"train.output_dir={out}",
        "train.eval_period=4",
        "train.checkpointer.period=4",
    ]
    _run(TRAIN_NET, *common, "train.max_iter=4", cwd=tmp_path)
    assert [r["iteration"] for r in ResultsFile(out).records("ap")] == [4]
    log = _run(TRAIN_NET, *common, "train.max_iter=8", "--resume", cwd=tmp_path)
    assert "Starting training from iteration 4" in log
    records = ResultsFile(out).records("ap")
    assert [r["iteration"] for r in records] == [4, 8]
    _run(
        TRAIN_NET,
        "--config-file",
        DETECTION_DEMO,
        "--eval-only",
        "train.device=cuda",
        f"train.init_checkpoint={out / 'model_final.pth'}",
        f"train.output_dir={tmp_path / 'eval'}",
        cwd=tmp_path,
    )
    (evaluated,) = ResultsFile(tmp_path / "eval").records("eval")
    a, b = evaluated["bbox"]["AP"], records[-1]["bbox"]["AP"]
    assert (a is None and b is None) or a == pytest.approx(b, abs=0.1)


@pytest.mark.parametrize("amp_dtype", ["float16", "bfloat16"])
def test_pretraining_amp_and_ema(tmp_path, amp_dtype):
    from condinit_det.data.classification import ShapesClsSpec, generate_classification_dataset

    spec = ShapesClsSpec(image_size=32, min_size=14.0, max_size=22.0, center_jitter=3.0, distractor_size=(4.0, 7.0))
    data = generate_classification_dataset(tmp_path / "shapes", num_train=96, num_val=16, spec=spec)
    out = tmp_path / "pre"
    opts = {
        "data.root": data,
        "data.img_size": 32,
        "model.kwargs.img_size": 32,
        "model.kwargs.depth": 2,
        "train.output_dir": out,
        "train.epochs": 2,
        "train.batch_size": 8,
        "train.workers": 0,
        "train.log_period": 4,
        "train.eval_batch_size": 16,
        "scheduler.warmup_epochs": 1,
        "train.device": "cuda",
        "train.amp": True,
        "train.amp_dtype": amp_dtype,
        "train.ema.enabled": True,
        "train.ema.decay": 0.9,
    }
    log = _run(
        PRETRAIN_NET,
        "--config-file",
        PRETRAIN_DEMO,
        "--arm",
        "mimetic",
        *[f"{k}={v}" for k, v in opts.items()],
        cwd=tmp_path,
    )
    assert f"AMP {amp_dtype}" in log
    run_dir = out / "mimetic" / "seed0"
    records = ResultsFile(run_dir).records("cls")
    assert [r["epoch"] for r in records] == [1, 2] and "ema" in records[-1]
    final = torch.load(run_dir / "model_final.pth", map_location="cpu", weights_only=False)
    assert final["weights"] == "ema"


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA devices")
def test_two_gpu_nccl_ddp_replica_check(tmp_path):
    out = tmp_path / "ddp"
    log = _run(
        TRAIN_NET,
        "--config-file",
        DETECTION_DEMO,
        "--num-gpus",
        "2",
        "--arm",
        "mimetic",
        "train.device=cuda",
        f"train.output_dir={out}",
        "train.max_iter=4",
        "train.eval_period=4",
        cwd=tmp_path,
    )
    assert "Replica check before training: all 2 processes hold identical weights" in log
    assert "Replica check after training: all 2 processes hold identical weights" in log
    assert [r["iteration"] for r in ResultsFile(out).records("ap")] == [4]
