"""Experiment status on synthetic run directories of both stages (no training)."""

import json
import os
import subprocess
import sys
import time

import pytest

from condinit_det.commands.status import main
from condinit_det.launch.status import experiment_status, format_table, summary_line
from condinit_det.records.layout import RunSpec, plan_runs, write_plan
from condinit_det.records.results import ResultsFile
from condinit_det.stage import DETECTION, PRETRAIN

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOW = time.time()
RECENT, OLD = NOW - 5, NOW - 3600


def _meta(spec):
    return {"arm": spec.arm, "seed": spec.seed, "lr_scale": spec.lr_scale, "config": "c.py"}


def _touch(run_dir, when):
    for name in ("log.txt", "metrics.json", "results.json"):
        path = os.path.join(run_dir, name)
        if os.path.exists(path):
            os.utime(path, (when, when))


def det_run(base, spec, *, evals=(), lines=(), failed=None, when=OLD):
    """A detection run: ``evals`` (iteration, box AP, mask AP); ``lines`` (0-based iteration, s/it, eta s)
    as detectron2's metrics.json writes them, with an evaluation line in between as it does."""
    run_dir = spec.path(base)
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "log.txt"), "w") as f:
        f.write("[12/01 10:00:00 d2.engine.train_loop]: Starting training from iteration 0\n")
    with open(os.path.join(run_dir, "metrics.json"), "w") as f:
        for it, sec, eta in lines:
            f.write(
                json.dumps(
                    {"data_time": 0.01, "eta_seconds": eta, "iteration": it, "lr": 1e-4, "time": sec, "total_loss": 2.0}
                )
                + "\n"
            )
            f.write(json.dumps({"bbox/AP": 1.0, "iteration": it, "segm/AP": 1.0}) + "\n")
    rf = ResultsFile(run_dir)
    for it, box, mask in evals:
        rf.add(
            {
                "kind": "ap",
                "stage": "detection",
                "iteration": it,
                **_meta(spec),
                "bbox": {"AP": box},
                "segm": {"AP": mask},
            }
        )
    if failed is not None:
        rf.add({"kind": "failed", **_meta(spec), **failed})
    _touch(run_dir, when)
    return run_dir


def pre_run(base, spec, *, evals=(), lines=(), failed=None, final=False, when=OLD, steps=12):
    """A pretraining run: ``evals`` (epoch, top-1); ``lines`` (step, s/step) with ``steps`` steps per epoch."""
    run_dir = spec.path(base)
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "log.txt"), "w") as f:
        f.write("[12/01 10:00:00 condinit_det.pretrain]: Training\n")
    with open(os.path.join(run_dir, "metrics.json"), "w") as f:
        for step, sec in lines:
            f.write(
                json.dumps(
                    {
                        "iteration": step,
                        "epoch": step / steps,
                        "total_loss": 2.0,
                        "lr": 1e-3,
                        "time": sec,
                        "data_time": 0.01,
                    }
                )
                + "\n"
            )
    rf = ResultsFile(run_dir)
    for epoch, top1 in evals:
        rf.add(
            {
                "kind": "cls",
                "stage": "pretrain",
                "iteration": epoch * steps,
                "epoch": epoch,
                **_meta(spec),
                "top1": top1,
                "top5": 90.0,
                "train_loss": 1.0,
                "eval_loss": 1.0,
                "lr": 1e-3,
            }
        )
    if failed is not None:
        rf.add({"kind": "failed", **_meta(spec), **failed})
    if final:
        open(os.path.join(run_dir, "model_final.pth"), "wb").close()
    _touch(run_dir, when)
    return run_dir


def by_arm(statuses, lr_scale=1.0):
    return {s.arm: s for s in statuses if s.lr_scale == lr_scale}


@pytest.fixture
def half_finished(tmp_path):
    """Detection, 100 iterations, lr scan 1,2: default finished, mimetic running (60 done, 20 s left at its
    last line, written 5 s ago), conditioned stopped at 40 an hour ago, the lr-2 runs not started."""
    base = str(tmp_path / "exp")
    runs = plan_runs(["default", "mimetic", "conditioned"], [0], [1.0, 2.0])
    write_plan(base, runs, stage=DETECTION, config="c.py", length=100)
    det_run(base, runs[0], evals=[(50, 10.0, 9.0), (100, 20.0, 18.0)], lines=[(49, 0.5, 25.0), (99, 0.5, 0.0)])
    det_run(base, runs[1], evals=[(50, 12.0, 11.0)], lines=[(39, 0.5, 30.0), (59, 0.5, 20.0)], when=RECENT)
    det_run(base, runs[2], lines=[(19, 0.7, 56.0), (39, 0.7, 42.0)], when=OLD)
    return base


def test_half_finished_detection(half_finished):
    statuses = experiment_status(half_finished, now=NOW)
    assert [(s.arm, s.lr_scale) for s in statuses] == [
        (a, sc) for sc in (1.0, 2.0) for a in ("default", "mimetic", "conditioned")
    ]
    runs = by_arm(statuses)
    assert [runs[a].state for a in ("default", "mimetic", "conditioned")] == ["finished", "running", "stopped"]
    assert all(
        s.state == "not started" and s.last is None and s.stage == "detection" for s in by_arm(statuses, 2.0).values()
    )
    d, m, c = runs["default"], runs["mimetic"], runs["conditioned"]
    assert (d.last, d.total, d.evaluation) == (100, 100, {"at": 100, "bbox": 20.0, "segm": 18.0})
    # metrics.json numbers iterations from 0: its line 59 is the 60th completed step
    assert (m.last, m.iteration, m.sec_per_iter, m.evaluation["at"]) == (60, 60, 0.5, 50)
    assert m.eta_seconds == pytest.approx(15.0, abs=0.5)  # 20 s at the last line, written 5 s ago
    assert (c.last, c.evaluation, c.eta_seconds, c.sec_per_iter) == (40, None, None, 0.7)
    assert d.eta_seconds is None  # ETA only while running
    assert m.log == os.path.join(half_finished, "mimetic", "seed0", "log.txt")
    assert all(s.job is None and s.planned for s in statuses)

    table = format_table(statuses, base=half_finished)
    lines = table.splitlines()
    assert len(lines) == 7 and lines[0].split()[:4] == ["arm", "seed", "lr", "state"]
    assert lines[2].split()[:6] == ["mimetic", "0", "1", "running", "it", "60/100"]
    assert "box 12.00 mask 11.00 @it 50" in lines[2] and "0:00:15" in lines[2]
    assert lines[2].endswith(os.path.join("mimetic", "seed0", "log.txt"))
    assert "log.txt (none yet)" in lines[4]
    assert summary_line(statuses) == "6 runs: 3 not started, 1 running, 1 stopped, 1 finished"


def test_stale_after_decides_running_or_stopped(half_finished):
    runs = by_arm(experiment_status(half_finished, now=NOW, stale_after=2.0))
    assert runs["mimetic"].state == "stopped" and runs["mimetic"].eta_seconds is None
    runs = by_arm(experiment_status(half_finished, now=NOW, stale_after=7200))
    assert runs["conditioned"].state == "running" and runs["conditioned"].eta_seconds == 0.0


def test_failed_and_diverged_runs(tmp_path):
    base = str(tmp_path / "exp")
    runs = plan_runs(["default", "mimetic", "conditioned"], [0], [1.0, 1e6])
    write_plan(base, runs, stage=DETECTION, config="c.py", length=12)
    for spec in runs[:3]:
        det_run(base, spec, evals=[(12, 5.0, 4.0)], lines=[(11, 0.5, 0.0)])
    det_run(
        base,
        runs[3],
        lines=[(1, 0.5, 5.0)],
        failed={
            "reason": "diverged",
            "iteration": 4,
            "message": "FloatingPointError: Predicted boxes or scores contain Inf/NaN. Training has diverged.",
        },
    )
    det_run(
        base,
        runs[4],
        evals=[(6, 1.0, 1.0)],
        lines=[(5, 0.5, 3.0)],
        when=RECENT,
        failed={"reason": "error", "iteration": 7, "message": "RuntimeError: DataLoader worker (pid 9) is killed"},
    )
    statuses = experiment_status(base, now=NOW)
    scan = by_arm(statuses, 1e6)
    assert [s.state for s in by_arm(statuses).values()] == ["finished"] * 3
    assert (scan["default"].state, scan["default"].last) == ("diverged", 4)
    # a failure record wins over a recent write, and a failed run has no ETA
    assert (scan["mimetic"].state, scan["mimetic"].last, scan["mimetic"].eta_seconds) == ("failed", 7, None)
    assert scan["mimetic"].failure["message"].startswith("RuntimeError: DataLoader worker")
    assert scan["conditioned"].state == "not started"
    table = format_table(statuses)
    assert "  default seed 0 lr scale 1e+06: diverged at iteration 4" in table.splitlines()
    assert "  mimetic seed 0 lr scale 1e+06: failed: RuntimeError: DataLoader worker (pid 9) is killed" in table
    assert summary_line(statuses) == "6 runs: 1 not started, 3 finished, 1 failed, 1 diverged"


def test_pretraining_experiment(tmp_path):
    """6 epochs of 12 steps: finished, running in epoch 3 (step 30), diverged in epoch 2, not started."""
    base = str(tmp_path / "pre")
    runs = [RunSpec(a, s) for s in (0, 1) for a in ("default", "conditioned")]
    write_plan(base, runs, stage=PRETRAIN, config="p.py", length=6)
    pre_run(
        base, runs[0], evals=[(e, 10.0 * e) for e in range(1, 7)], lines=[(s, 0.2) for s in (24, 48, 72)], final=True
    )
    pre_run(base, runs[1], evals=[(1, 12.0), (2, 25.0)], lines=[(24, 0.2), (30, 0.25)], when=RECENT)
    pre_run(
        base,
        runs[2],
        evals=[(1, 11.0)],
        lines=[(16, 0.2)],
        failed={"reason": "diverged", "iteration": 17, "epoch": 1, "message": "FloatingPointError: loss became nan"},
    )
    statuses = experiment_status(base, now=NOW)
    f, r, dv, ns = statuses
    assert [s.state for s in statuses] == ["finished", "running", "diverged", "not started"]
    assert (f.last, f.total, f.unit, f.evaluation["top1"], f.evaluation["at"]) == (6, 6, "epoch", 60.0, 6)
    assert (r.last, r.iteration, r.sec_per_iter, r.evaluation["top1"]) == (2.5, 30, 0.25, 25.0)
    # 3.5 epochs x 12 steps x 0.25 s at the last line, written 5 s ago
    assert r.eta_seconds == pytest.approx(3.5 * 12 * 0.25 - 5, abs=0.5)
    assert (dv.iteration, dv.failure["epoch"], dv.stage) == (17, 1, "pretrain")
    assert (ns.stage, ns.unit, ns.total) == ("pretrain", "epoch", 6)
    lines = format_table(statuses).splitlines()
    assert "epoch 2.50/6 (it 30)" in lines[2] and "top-1 25.00 @ep 2" in lines[2]
    assert "  default seed 1: diverged at iteration 17" in lines


def test_runs_without_plan_and_set_aside_runs(tmp_path):
    base = str(tmp_path / "exp")
    runs = plan_runs(["default", "conditioned"], [0])
    write_plan(base, runs, stage=DETECTION, config="c.py", length=12)
    det_run(base, runs[0], evals=[(12, 2.0, 1.0)], lines=[(11, 0.5, 0.0)])
    det_run(base, runs[1], lines=[(5, 0.5, 3.0)])
    os.rename(runs[1].path(base), runs[1].path(base) + ".failed0")  # moved aside by --retry-failed
    det_run(base, RunSpec("mimetic", 3), evals=[(6, 1.0, 1.0)], lines=[(5, 0.5, 3.0)])  # not in this plan
    statuses = experiment_status(base, now=NOW)
    assert [(s.arm, s.seed, s.state, s.planned) for s in statuses] == [
        ("default", 0, "finished", True),
        ("conditioned", 0, "not started", True),
        ("mimetic", 3, "stopped", False),
    ]
    assert "1 run(s) listed in no plan: " + os.path.join(base, "mimetic", "seed3") in format_table(statuses)

    # One run directory: its plan lies two levels up.
    (only,) = experiment_status(runs[0].path(base), now=NOW)
    assert (only.arm, only.seed, only.stage, only.last, only.planned, only.state) == (
        "default",
        0,
        "detection",
        12,
        True,
        "finished",
    )
    # A run directory outside any plan: identity and stage from its records, its length from its final file.
    alone = tmp_path / "alone"
    os.makedirs(alone)
    os.replace(runs[0].path(base), alone / "run")
    open(alone / "run" / "model_final.pth", "wb").close()
    (found,) = experiment_status(str(alone / "run"), now=NOW)
    assert (found.arm, found.stage, found.total, found.state, found.planned) == (
        "default",
        "detection",
        12,
        "finished",
        False,
    )


@pytest.mark.parametrize("report", ['{"run": "conditioned", "arm": "conditioned"}', "[1, 2]", "{not json"])
def test_a_run_whose_arm_report_is_not_one_is_unreadable_and_the_others_shown(tmp_path, report):
    base = str(tmp_path / "exp")
    det_run(base, RunSpec("default", 0), evals=[(6, 1.0, 1.0)], lines=[(5, 0.5, 3.0)])
    det_run(base, RunSpec("mimetic", 0), evals=[(6, 1.0, 1.0)], lines=[(5, 0.5, 3.0)])
    with open(os.path.join(RunSpec("mimetic", 0).path(base), "condinit_arm_report.json"), "w") as f:
        f.write(report)
    statuses = {s.path: s for s in experiment_status(base, now=NOW)}
    bad = statuses[RunSpec("mimetic", 0).path(base)]
    assert bad.state == "unreadable" and "condinit_arm_report.json" in bad.problem
    assert statuses[RunSpec("default", 0).path(base)].state == "stopped"
    assert "unreadable" in format_table(list(statuses.values()))


def test_json_output(half_finished, capsys):
    # --stale-after as the fixture's clock would have it (its files are dated from the module's import)
    assert main([half_finished, "--json", "--stale-after", str(time.time() - NOW + 600)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["counts"] == {
        "not started": 3,
        "queued": 0,
        "running": 1,
        "stopped": 1,
        "cancelled": 0,
        "finished": 1,
        "failed": 0,
        "diverged": 0,
        "unreadable": 0,
    }
    runs = {(r["arm"], r["lr_scale"]): r for r in data["runs"]}
    m = runs[("mimetic", 1.0)]
    assert (m["state"], m["last"], m["total"], m["unit"], m["job"]) == ("running", 60, 100, "iteration", None)
    # (the value depends on the wall clock since the fixture was written: test_half_finished_detection pins it)
    assert m["eta_seconds"] is not None and m["evaluation"] == {"at": 50, "bbox": 12.0, "segm": 11.0}
    assert runs[("default", 2.0)]["state"] == "not started" and data["stale_after"] > 600


def test_a_corrupt_results_file_is_named_and_the_other_runs_shown(half_finished, capsys):
    bad = os.path.join(half_finished, "default", "seed0", "results.json")
    with open(bad, "w") as f:
        f.write('{"version": 1, "records": [')
    assert main([half_finished, "--stale-after", "1e9"]) == 0
    out = capsys.readouterr().out
    assert "unreadable" in out and f"{bad} is not valid JSON" in out
    assert out.strip().splitlines()[-1] == "6 runs: 3 not started, 2 running, 1 unreadable"
    with open(bad) as f:
        assert f.read() == '{"version": 1, "records": ['  # read-only: never rewritten


def test_bad_input_gives_one_line_and_status_2(tmp_path, capsys):
    assert main([str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not a directory" in err
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no experiment plan" in err
    (tmp_path / "experiment.json").write_text("{not json")
    assert main([str(tmp_path)]) == 2
    assert "is not valid JSON" in capsys.readouterr().err
    (tmp_path / "experiment.json").write_text('{"runs": [{"arm": "default", "seed": 0}, {"seed": 1}]}')
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "a run entry is not valid (KeyError: 'arm')" in err and "'seed'" in err
    assert main([str(tmp_path), "--stale-after", "0"]) == 2
    assert "expected a positive number of seconds" in capsys.readouterr().err


def test_tool_prints_table_and_summary(half_finished):
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "tools", "experiment_status.py"), half_finished, "--stale-after", "1e9"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONWARNINGS="ignore"),
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 8 and lines[0].startswith("arm ")
    # with an hour-old write still counted as recent, the stopped run shows as running
    assert lines[-1] == "6 runs: 3 not started, 2 running, 1 finished"
