"""Failures are results: a diverged or failed run is recorded, the experiment goes on, the report shows it,
the command exits non-zero naming it, and --resume / --retry-failed follow the resume rules."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from condinit_det.init import ARMS
from condinit_det.records.results import ResultsFile
from condinit_det.records.layout import RunSpec, is_set_aside
from condinit_det.launch.experiment import execute_runs, failure_summary
from condinit_det.records.failures import failure_of, note_failure

ROOT = Path(__file__).resolve().parents[1]
TRAIN_NET = str(ROOT / "tools" / "train_net.py")
PRETRAIN_NET = str(ROOT / "tools" / "pretrain_net.py")
CONFIG = str(ROOT / "tests" / "tiny_train_config.py")
FAILING_CONFIG = str(ROOT / "tests" / "tiny_failing_config.py")
HUGE = "100000000"  # x the config's learning rate: the tiny detector diverges within two iterations


def _env(**extra):
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore", **extra)


def _tool(tool, *argv, cwd, **env):
    proc = subprocess.run([sys.executable, tool, *argv], cwd=cwd, env=_env(**env), capture_output=True, text=True,
                          timeout=1200)
    return proc.returncode, proc.stdout, proc.stderr


def _last_lines(stderr, n=8):
    return [line for line in stderr.strip().splitlines() if line.strip()][-n:]


# ---------------------------------------------------------------------------------------------
# The loop itself (no training)
# ---------------------------------------------------------------------------------------------
def test_execute_runs_records_a_failure_and_goes_on(tmp_path):
    runs = [RunSpec("default", 0), RunSpec("mimetic", 0), RunSpec("conditioned", 0)]
    trained = []

    def launch(spec):
        run_dir = spec.path(str(tmp_path))
        os.makedirs(run_dir, exist_ok=True)
        trained.append(spec.arm)
        if spec.arm == "mimetic":
            ResultsFile(run_dir).add({"kind": "ap", "iteration": 10, "arm": "mimetic"})
            error = FloatingPointError("Loss became infinite or NaN at iteration=13!")
            note_failure(run_dir, error, rank=1, iteration=13)  # the process that saw it first
            time.sleep(0.01)
            note_failure(run_dir, RuntimeError("Connection closed by peer"), rank=0, iteration=13)
            raise RuntimeError("process 1 terminated")
        ResultsFile(run_dir).add({"kind": "ap", "iteration": 20, "arm": spec.arm})

    outcomes = execute_runs(runs, str(tmp_path), launch=launch, finished=lambda s: False, resume=False, config="c.py")
    assert trained == ["default", "mimetic", "conditioned"]
    failed = [o for o in outcomes if o.failure is not None]
    assert [o.spec.arm for o in failed] == ["mimetic"]
    record = failure_of(RunSpec("mimetic", 0).path(str(tmp_path)))
    assert record == {"kind": "failed", "reason": "diverged", "iteration": 13,
                      "message": "FloatingPointError: Loss became infinite or NaN at iteration=13!",
                      "arm": "mimetic", "seed": 0, "lr_scale": 1.0, "config": "c.py"}
    assert not list(Path(tmp_path).rglob("failure.rank*.json"))  # notes are consumed
    lines = failure_summary(outcomes)
    assert lines[0] == "1 of 3 run(s) did not finish:" and "mimetic seed 0: diverged at iteration 13" in lines[1]

    # --resume: the diverged run is not retried, finished runs are skipped.
    trained.clear()
    outcomes = execute_runs(runs, str(tmp_path), launch=launch, finished=lambda s: s.arm != "mimetic", resume=True)
    assert trained == [] and [o.failure is not None for o in outcomes] == [False, True, False]
    # --retry-failed: moved aside and trained afresh (and here it diverges again).
    outcomes = execute_runs(runs, str(tmp_path), launch=launch, finished=lambda s: s.arm != "mimetic", resume=True,
                            retry_failed=True)
    assert trained == ["mimetic"]
    aside = Path(RunSpec("mimetic", 0).path(str(tmp_path)) + ".failed0")
    assert aside.is_dir() and is_set_aside(aside.name) and failure_of(str(aside))["iteration"] == 13


def test_an_error_without_a_note_and_resume_of_an_error(tmp_path):
    spec = RunSpec("conditioned", 1, 2.0)
    run_dir = spec.path(str(tmp_path))
    calls = []

    def launch(s):
        calls.append(s)
        os.makedirs(run_dir, exist_ok=True)
        if len(calls) == 1:
            ResultsFile(run_dir).add({"kind": "ap", "iteration": 4})
            raise MemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    (outcome,) = execute_runs([spec], str(tmp_path), launch=launch, finished=lambda s: False, resume=False)
    assert outcome.failure["reason"] == "error" and outcome.failure["iteration"] == 4  # the last one recorded
    assert outcome.failure["message"].startswith("MemoryError: CUDA out of memory")
    assert "lr scale 2" in failure_summary([outcome])[1] and "failed: MemoryError" in failure_summary([outcome])[1]
    # --resume continues a run that failed with an error; its failure record goes.
    (outcome,) = execute_runs([spec], str(tmp_path), launch=launch, finished=lambda s: False, resume=True)
    assert len(calls) == 2 and outcome.failure is None and failure_of(run_dir) is None
    assert [r["kind"] for r in ResultsFile(run_dir).records()] == ["ap"]


def test_report_shows_failed_runs(tmp_path):
    from condinit_det.report import compare_arms

    def run(arm, scale, aps, failure=None):
        d = RunSpec(arm, 0, scale).path(str(tmp_path))
        rf = ResultsFile(d)
        for it, ap in aps:
            rf.add({"kind": "ap", "iteration": it, "arm": arm, "seed": 0, "lr_scale": scale,
                    "bbox": {"AP": ap, "AP50": ap, "AP75": ap}, "segm": {"AP": ap, "AP50": ap, "AP75": ap}})
        if failure:
            rf.add({"kind": "failed", "arm": arm, "seed": 0, "lr_scale": scale, **failure})

    run("default", 1.0, [(10, 20.0), (20, 30.0)])
    run("mimetic", 1.0, [(10, 22.0), (20, 31.0)])
    run("conditioned", 1.0, [(10, 25.0)], {"reason": "diverged", "iteration": 14, "message": "FloatingPointError: x"})
    for arm in ARMS:
        run(arm, 1e6, [], {"reason": "diverged", "iteration": 3, "message": "FloatingPointError: y"})
    run("mimetic", 2.0, [(10, 5.0)], {"reason": "error", "iteration": 12, "message": "RuntimeError: disk full"})
    report, md = compare_arms([str(tmp_path)], output_dir=str(tmp_path / "report"), bootstrap=0)
    main = md.split("### Convergence")[0]
    assert "| conditioned | diverged at iteration 14 |" in main  # in the table, never averaged
    conv = md.split("### Convergence")[1].split("### Paired")[0]
    assert "| AP^b | 30.0 at iteration 20 | 20 (0.0%) | 20 (0.0%) | diverged |" in conv
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
def test_detection_experiment_with_a_diverging_lr(tmp_path):
    exp = tmp_path / "exp"
    argv = ["--config-file", CONFIG, "--arm", "all", "--lr-scale", f"1,{HUGE}", "train.max_iter=3",
            "train.eval_period=1", f"train.output_dir={exp}"]
    rc, out, err = _tool(TRAIN_NET, *argv, cwd=tmp_path)
    assert rc == 1, err[-3000:]
    scan = [RunSpec(arm, 0, float(HUGE)) for arm in ARMS]
    diverged = [s for s in scan if (failure_of(s.path(str(exp))) or {}).get("reason") == "diverged"]
    assert diverged, [failure_of(s.path(str(exp))) for s in scan]
    for arm in ARMS:  # every run at the config's learning rate finished
        assert [r["iteration"] for r in ResultsFile(RunSpec(arm, 0).path(str(exp))).records("ap")] == [1, 2, 3]
    tail = "\n".join(_last_lines(err))
    first = failure_of(diverged[0].path(str(exp)))
    assert "did not finish" in tail and f"{diverged[0].arm} seed 0 lr scale 1e+08: diverged at iteration " \
        f"{first['iteration']}" in tail
    md = (exp / "report" / "report.md").read_text()
    assert f"diverged at iteration {first['iteration']}" in md.split("### Learning-rate sensitivity")[1]
    log = (Path(diverged[0].path(str(exp))) / "log.txt").read_text()
    assert "Traceback" in log and "FloatingPointError" in log
    for s in diverged:  # no evaluation after the failure (detectron2 calls after_train on the way out)
        failure = failure_of(s.path(str(exp)))
        assert all(r["iteration"] <= failure["iteration"] for r in ResultsFile(s.path(str(exp))).records("ap"))

    # --resume: nothing is retrained, the diverged runs are named and still fail the command.
    rc, out, err = _tool(TRAIN_NET, "--resume", *argv, cwd=tmp_path)
    assert rc == 1 and "not retried" in out + err and (out + err).count("already finished") == 3
    # --retry-failed: the diverged runs are moved aside and trained afresh.
    rc, out, err = _tool(TRAIN_NET, "--retry-failed", *argv, cwd=tmp_path)
    assert rc == 1 and "moved aside" in out + err
    for s in diverged:
        assert Path(s.path(str(exp)) + ".failed0").is_dir() and failure_of(s.path(str(exp))) is not None
    md = (exp / "report" / "report.md").read_text()
    assert ".failed0" not in md


@pytest.mark.slow
def test_detection_run_whose_loader_raises_then_resume(tmp_path):
    exp = tmp_path / "exp"
    env = {"CONDINIT_FAIL_ONCE": str(tmp_path / "failed-once"), "CONDINIT_FAIL_AT": "2"}
    argv = ["--config-file", FAILING_CONFIG, "--arm", "all", "train.max_iter=2", "train.eval_period=2",
            f"train.output_dir={exp}"]
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
    rc, out, err = _tool(TRAIN_NET, "--config-file", FAILING_CONFIG, "--num-gpus", "2", "--dist-url", "auto",
                         "--arm", "conditioned", "train.max_iter=20", "train.eval_period=20",
                         f"train.output_dir={out_dir}", cwd=tmp_path, **env)
    elapsed = time.time() - start
    assert rc == 1, err[-3000:]
    run_dir = RunSpec("conditioned", 0).path(str(out_dir))
    failed = ResultsFile(run_dir).records("failed")
    assert len(failed) == 1 and failed[0]["message"] == "RuntimeError: data loader failed on batch 2"
    assert failed[0]["iteration"] == 1 and not list(Path(run_dir).glob("failure.rank*.json"))
    assert elapsed < 240, f"the processes took {elapsed:.0f} s to stop"
    assert not ResultsFile(run_dir).records("ap")


# ---------------------------------------------------------------------------------------------
# End to end: pretraining
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_pretraining_experiment_with_a_diverging_lr(tmp_path):
    from condinit_det.data.classification import ShapesClsSpec, generate_classification_dataset

    spec = ShapesClsSpec(image_size=32, min_size=14.0, max_size=22.0, center_jitter=3.0, distractor_size=(4.0, 7.0))
    data = str(generate_classification_dataset(tmp_path / "shapes", num_train=32, num_val=8, spec=spec))
    exp = tmp_path / "exp"
    overrides = {"data.root": data, "data.img_size": 32, "model.kwargs.img_size": 32, "model.kwargs.depth": 1,
                 "train.output_dir": exp, "train.epochs": 2, "train.batch_size": 8, "train.workers": 0,
                 "train.log_period": 2, "train.eval_batch_size": 8, "scheduler.warmup_epochs": 0}
    argv = ["--config-file", str(ROOT / "configs" / "demo" / "pretrain_vit_tiny.py"), "--arm", "all",
            "--lr-scale", f"1,{HUGE}", *[f"{k}={v}" for k, v in overrides.items()]]
    rc, out, err = _tool(PRETRAIN_NET, *argv, cwd=tmp_path)
    assert rc == 1, err[-3000:]
    diverged = [RunSpec(arm, 0, float(HUGE)) for arm in ARMS
                if (failure_of(RunSpec(arm, 0, float(HUGE)).path(str(exp))) or {}).get("reason") == "diverged"]
    assert diverged
    first = failure_of(diverged[0].path(str(exp)))
    assert first["iteration"] >= 1 and first["epoch"] in (0, 1) and "loss became" in first["message"]
    for arm in ARMS:
        assert [r["epoch"] for r in ResultsFile(RunSpec(arm, 0).path(str(exp))).records("cls")] == [1, 2]
    assert f"{diverged[0].arm} seed 0 lr scale 1e+08: diverged at iteration {first['iteration']}" in \
        "\n".join(_last_lines(err))
    md = (exp / "report" / "report.md").read_text()
    assert f"diverged at iteration {first['iteration']}" in md.split("### Learning-rate sensitivity")[1]
    rc, out, err = _tool(PRETRAIN_NET, "--resume", *argv, cwd=tmp_path)
    assert rc == 1 and "not retried" in out + err
