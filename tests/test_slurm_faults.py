"""Faults change no number: the paper's protocol at test size on the one-node Slurm (pretraining, then each arm's
fine-tuning from its own pretraining run, then the report), disturbed at random moments by SIGKILL of a running
element, ``scontrol requeue`` and the time-limit signal USR2, ends as the same protocol undisturbed. Skipped without a
cluster (tools/slurm_local.sh start; .ci/run starts one)."""

import os
import random
import subprocess
import time
from pathlib import Path

import pytest
from forked_tool import run_tool
from test_exact_resume import untimed_metrics  # tests/ is on sys.path (pytest, rootdir mode)

from condinit_det.launch.status import experiment_status
from condinit_det.records.jobs import read_jobs, read_report_jobs
from condinit_det.records.results import ResultsFile
from condinit_det.utils.squeue import query_jobs, still_runs

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[1]
PROTOCOL = str(ROOT / "tools" / "submit_protocol.py")
ARMS = ("default", "conditioned")
EPOCHS, ITERATIONS = 3, 24
FAULTS = ("kill", "requeue", "usr2")
PRETRAIN = {"train.epochs": EPOCHS, "train.batch_size": 8, "train.workers": 0, "train.eval_batch_size": 8}
FINETUNE = {
    "train.max_iter": ITERATIONS,
    "train.eval_period": 8,
    "train.checkpointer.period": 4,
    "condinit_analysis.period": 0,
}


def _argv(out, data):
    argv = ["--pretrain-config", str(ROOT / "configs" / "demo" / "pretrain_vit_tiny.py")]
    argv += ["--finetune-config", str(ROOT / "configs" / "demo" / "mask_rcnn_vit_tiny_finetune.py")]
    argv += ["--output", str(out), "--arm", ",".join(ARMS), "--seeds", "0", "--time", "30", "--cpus-per-task", "1"]
    argv += ["--signal-delay", "10"]
    pretrain = {"data.root": data, "scheduler.warmup_epochs": 0, **PRETRAIN}
    argv += [a for key, value in pretrain.items() for a in ("--pretrain-opt", f"{key}={value}")]
    return argv + [a for key, value in FINETUNE.items() for a in ("--finetune-opt", f"{key}={value}")]


def _submit(out, data, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = run_tool(PROTOCOL, *_argv(out, data), cwd=cwd, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


def _run_jobs(out):
    """The current job of every run of both stages, with its squeue state."""
    runs = {f"{stage}/{run}": job for stage in ("pretrain", "finetune") for run, job in read_jobs(out / stage).items()}
    states = query_jobs(list(runs.values())).states
    return {run: (job, states.get(job)) for run, job in runs.items()}


def _runs_finished(out):
    return all(s.state == "finished" for stage in ("pretrain", "finetune") for s in experiment_status(str(out / stage)))


def _settle(out, data, cwd, timeout=1500):
    """Wait until no run job of ``out`` may still run; submit the protocol again while a run is unfinished (a killed
    element fails its job, and submitting again continues its run, as a user would); then wait for the report."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(still_runs(state) for _, state in _run_jobs(out).values()):
            time.sleep(2)
        elif not _runs_finished(out):
            _submit(out, data, cwd)
        else:
            report = read_report_jobs(str(out))[-1]
            while still_runs(query_jobs([report]).get(report)) and time.time() < deadline:
                time.sleep(2)
            return
    raise AssertionError(f"{out} did not finish within {timeout} s: {_run_jobs(out)}")


def _inject(out, data, cwd, rng):
    """Three faults into running pretraining elements, then three into running fine-tuning elements, each at a random
    moment (a protocol whose jobs all ended unfinished is submitted again); returns what landed where."""
    plan = [("pretrain", f) for f in rng.sample(FAULTS, 3)] + [("finetune", f) for f in rng.sample(FAULTS, 3)]
    landed, deadline = [], time.time() + 1500
    while len(landed) < len(plan) and time.time() < deadline:
        time.sleep(rng.uniform(2.0, 10.0))
        stage, fault = plan[len(landed)]
        jobs = _run_jobs(out)
        running = sorted(run for run, (_, state) in jobs.items() if state == "RUNNING" and run.startswith(stage))
        if not running:
            if not any(still_runs(state) for _, state in jobs.values()):
                _submit(out, data, cwd)
            continue
        run = rng.choice(running)
        job = jobs[run][0]
        command = {
            "kill": ["scancel", "--signal=KILL", job],
            "requeue": ["scontrol", "requeue", job],
            "usr2": ["scancel", "--signal=USR2", job],
        }[fault]
        if subprocess.run(command, capture_output=True, timeout=60).returncode == 0:
            landed.append((fault, run, job))
    return landed


def _comparable(run_dir):
    """The records of a run but the machine each start ran on."""
    return [r for r in ResultsFile(str(run_dir)).records() if r["kind"] != "environment"]


def test_faults_at_random_moments_change_no_number(slurm_env):
    from condinit_det.data.classification import ShapesClsSpec, generate_classification_dataset

    spec = ShapesClsSpec(image_size=32, min_size=14.0, max_size=22.0, center_jitter=3.0, distractor_size=(4.0, 7.0))
    data = generate_classification_dataset(slurm_env / "shapes", num_train=48, num_val=8, spec=spec)
    quiet, faulty = slurm_env / "quiet", slurm_env / "faulty"
    _submit(quiet, data, slurm_env)
    _submit(faulty, data, slurm_env)
    seed = random.randrange(10**6)
    landed = _inject(faulty, data, slurm_env, random.Random(seed))
    print(f"faults (seed {seed}):", landed)
    assert len(landed) == 6, f"only {len(landed)} faults landed: {landed}"
    _settle(faulty, data, slurm_env)
    _settle(quiet, data, slurm_env)
    assert _runs_finished(quiet) and _runs_finished(faulty)

    for arm in ARMS:
        pretrain, finetune = (Path("pretrain", arm, "seed0"), Path("finetune", arm, "seed0"))
        records = _comparable(faulty / pretrain)
        assert [r["epoch"] for r in records if r["kind"] == "cls"] == list(range(1, EPOCHS + 1))
        assert [r["iteration"] for r in _comparable(faulty / finetune) if r["kind"] == "ap"] == [8, 16, 24]
        for run in (pretrain, finetune):
            assert _comparable(faulty / run) == _comparable(quiet / run), run  # every metric, bitwise
            assert untimed_metrics(faulty / run) == untimed_metrics(quiet / run), run  # every logged loss
            files = sorted(p.name for p in (quiet / run / "per_image").iterdir())
            assert files and files == sorted(p.name for p in (faulty / run / "per_image").iterdir())
            for name in files:
                assert (quiet / run / "per_image" / name).read_bytes() == (
                    faulty / run / "per_image" / name
                ).read_bytes()
        # Each fine-tuning started from its own arm's pretraining run, once that had finished.
        arm_report = faulty / finetune / "condinit_arm_report.json"
        assert f"pretrain/{arm}/seed0" in arm_report.read_text()
        assert arm_report.stat().st_mtime >= (faulty / pretrain / "model_final.pth").stat().st_mtime
    report = (faulty / "report" / "report.md").read_text()
    assert "## Classification pretraining" in report and "## Detection" in report
    for table in ("summary.csv", "stats.csv"):
        texts = [(out / "report" / table).read_text().replace(str(out), "OUT") for out in (quiet, faulty)]
        assert texts[0] == texts[1], table
