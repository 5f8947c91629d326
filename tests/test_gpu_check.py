"""tools/gpu_check.py and the gpu marker, where there is no CUDA device."""
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*argv):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_gpu_check_refuses_without_a_cuda_device():
    proc = _run(os.path.join("tools", "gpu_check.py"))
    assert proc.returncode == 2
    assert proc.stderr.strip() == "gpu-check: error: no CUDA device is available; run it on a machine with a GPU"


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skips of a machine without CUDA")
def test_gpu_tests_skip_with_a_reason():
    proc = _run("-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rs",
                os.path.join("tests", "test_gpu.py"))
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "16 skipped" in proc.stdout and "passed" not in proc.stdout and "failed" not in proc.stdout
    assert "needs a CUDA device (make gpu-check)" in proc.stdout
