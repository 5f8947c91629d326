"""Every bench/ script runs end to end in its quick mode and exits with status 0."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (script under bench/, quick-mode arguments, a line the output must contain)
BENCH_SCRIPTS = [
    ("bench_eval.py", ["--quick"], "OK: all metrics identical within 1e-09"),
    ("bench_init_cost.py", ["--quick"], "| demo_vit_tiny"),
    ("bench_train_step.py", ["--quick"], "OK: every variant starts from the baseline's weights"),
    ("bench_demo.py", ["--quick"], "OK: 3 arms trained and evaluated at iteration 2"),
    ("bench_bootstrap.py", ["--quick"], "OK: accumulated AP equals re-evaluated AP within 1e-09"),
    ("bench_cli.py", ["--quick"], "| condinit-train --help"),
    ("bench_conditioning.py", ["--quick", "--threads", "1"], "OK: exact per-head kappa equals the dense Jacobian's"),
    ("bench_conditioning.py", ["--quick", "--ends", "--threads", "1"], "OK: the extreme two equal the full SVD's ends"),
]


@pytest.mark.parametrize("script, args, expected", BENCH_SCRIPTS, ids=[" ".join([s, *a]) for s, a, _ in BENCH_SCRIPTS])
def test_bench_script_quick(script, args, expected):
    path = os.path.join(REPO, "bench", script)
    assert os.path.isfile(path), path
    proc = subprocess.run(
        [sys.executable, path, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{script} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert expected in proc.stdout, proc.stdout[-3000:]
