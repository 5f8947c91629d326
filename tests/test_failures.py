"""Failures are results: the report shows a failed run where its numbers would be, a detection run whose data
loader raises is recorded and resumed, and the processes of a run stop together when one of them raises. (The
launcher's rules for failures, resume and retry, for both stages: tests/test_launcher.py.)"""

import os
import time
from pathlib import Path

import pytest
from forked_tool import run_tool
from table_text import unpadded

from condinit_det.init import PAPER_ARMS as ARMS
from condinit_det.records.failures import failure_of
from condinit_det.records.layout import RunSpec
from condinit_det.records.results import ResultsFile

ROOT = Path(__file__).resolve().parents[1]
TRAIN_NET = str(ROOT / "tools" / "train_net.py")
PRETRAIN_NET = str(ROOT / "tools" / "pretrain_net.py")
CONFIG = str(ROOT / "tests" / "tiny_train_config.py")
FAILING_CONFIG = str(ROOT / "tests" / "tiny_failing_config.py")
HUGE = "100000000"  # x the config's learning rate: the tiny detector diverges within two iterations


def _env(**extra):
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore", **extra)


def _tool(tool, *argv, cwd, **env):
    proc = run_tool(tool, *argv, cwd=cwd, env=_env(**env))
    return proc.returncode, proc.stdout, proc.stderr


def _last_lines(stderr, n=8):
    return [line for line in stderr.strip().splitlines() if line.strip()][-n:]


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------
def test_report_shows_failed_runs(tmp_path):
    from condinit_det.report import compare_arms

    def run(arm, scale, aps, failure=None):
        d = RunSpec(arm, 0, scale).path(str(tmp_path))
        rf = ResultsFile(d)
        for it, ap in aps:
            rf.add(
                {
                    "kind": "ap",
                    "stage": "detection",
                    "iteration": it,
                    "arm": arm,
                    "seed": 0,
                    "lr_scale": scale,
                    "bbox": {"AP": ap, "AP50": ap, "AP75": ap},
                    "segm": {"AP": ap, "AP50": ap, "AP75": ap},
                }
            )
        if failure:
            rf.add({"kind": "failed", "stage": "detection", "arm": arm, "seed": 0, "lr_scale": scale, **failure})

    run("default", 1.0, [(10, 20.0), (20, 30.0)])
    run("mimetic", 1.0, [(10, 22.0), (20, 31.0)])
    run("conditioned", 1.0, [(10, 25.0)], {"reason": "diverged", "iteration": 14, "message": "FloatingPointError: x"})
    for arm in ARMS:
        run(arm, 1e6, [], {"reason": "diverged", "iteration": 3, "message": "FloatingPointError: y"})
    run("mimetic", 2.0, [(10, 5.0)], {"reason": "error", "iteration": 12, "message": "RuntimeError: disk full"})
    report, md = compare_arms([str(tmp_path)], output_dir=str(tmp_path / "report"), bootstrap=0)
    main = md.split("### Convergence")[0]
    assert "| conditioned | diverged at iteration 14 |" in unpadded(main)  # in the table, never averaged
    conv = md.split("### Convergence")[1].split("### Paired")[0]
    assert "| AP^b | 30.0 at iteration 20 | 20 (0.0%) | 20 (0.0%) | diverged |" in unpadded(conv)
    stats = md.split("### Paired statistics")[1].split("### Learning-rate")[0]
    assert "conditioned: no finished run to pair: seed 0 diverged at iteration 14" in stats
    lr = md.split("### Learning-rate sensitivity")[1].split("### Missing")[0]
    assert lr.count("diverged at iteration 3") == 3 and "failed: RuntimeError: disk full" in lr
    assert report.stage("detection").arm("mimetic").final["AP^b"][0] == 31.0
    assert os.path.isfile(tmp_path / "report" / "bbox_ap.png")


# ---------------------------------------------------------------------------------------------
# End to end: detection
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_detection_run_whose_loader_raises_then_resume(tmp_path):
    exp = tmp_path / "exp"
    env = {"CONDINIT_FAIL_ONCE": str(tmp_path / "failed-once"), "CONDINIT_FAIL_AT": "2"}
    argv = [
        "--config-file",
        FAILING_CONFIG,
        "--arm",
        "all",
        "train.max_iter=2",
        "train.eval_period=2",
        f"train.output_dir={exp}",
    ]
    rc, out, err = _tool(TRAIN_NET, *argv, cwd=tmp_path, **env)
    assert rc == 1, err[-3000:]
    failure = failure_of(RunSpec("default", 0).path(str(exp)))
    assert failure["reason"] == "error" and failure["iteration"] == 1
    assert failure["message"] == "RuntimeError: data loader failed on batch 2"
    assert "default seed 0: failed: RuntimeError: data loader failed on batch 2" in "\n".join(_last_lines(err))
    for arm in ("mimetic", "conditioned"):
        assert [r["iteration"] for r in ResultsFile(RunSpec(arm, 0).path(str(exp))).records("ap")] == [2]
    # --resume continues the run that failed with an error; the experiment is then complete.
    rc, out, err = _tool(TRAIN_NET, "--resume", *argv, cwd=tmp_path, **env)
    assert rc == 0, err[-3000:]
    assert failure_of(RunSpec("default", 0).path(str(exp))) is None
    assert [r["iteration"] for r in ResultsFile(RunSpec("default", 0).path(str(exp))).records("ap")] == [2]
    assert "diverged" not in (exp / "report" / "report.md").read_text()


@pytest.mark.slow
def test_two_processes_stop_together_when_one_rank_raises(tmp_path):
    out_dir = tmp_path / "ddp"
    env = {"CONDINIT_FAIL_RANK": "1", "CONDINIT_FAIL_AT": "2", "CUDA_VISIBLE_DEVICES": ""}
    start = time.time()
    rc, out, err = _tool(
        TRAIN_NET,
        "--config-file",
        FAILING_CONFIG,
        "--num-gpus",
        "2",
        "--dist-url",
        "auto",
        "--arm",
        "conditioned",
        "train.max_iter=20",
        "train.eval_period=20",
        f"train.output_dir={out_dir}",
        cwd=tmp_path,
        **env,
    )
    elapsed = time.time() - start
    assert rc == 1, err[-3000:]
    run_dir = RunSpec("conditioned", 0).path(str(out_dir))
    failed = ResultsFile(run_dir).records("failed")
    assert len(failed) == 1 and failed[0]["message"] == "RuntimeError: data loader failed on batch 2"
    assert failed[0]["iteration"] == 1 and not list(Path(run_dir).glob("failure.rank*.json"))
    assert elapsed < 240, f"the processes took {elapsed:.0f} s to stop"
    assert not ResultsFile(run_dir).records("ap")
