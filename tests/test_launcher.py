"""The launcher's behaviours, once for every stage: plan, failure records, resume, retry, fresh runs, the plan file,
the command line, ``--dry-run``.

A fake stage (a few lines: what a third stage would write) drives the launcher in this process for the fast
tests; the slow end-to-end test runs the same scenario through both real commands (detection and pretraining).
"""

import csv
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from condinit_det.init import PAPER_ARMS
from condinit_det.launch.arguments import build_parser
from condinit_det.launch.plan import describe_plan, plan_experiment
from condinit_det.launch.run import execute, failure_summary
from condinit_det.records.failures import failure_of, note_failure
from condinit_det.records.layout import PLAN_FILENAME, RunSpec, is_set_aside
from condinit_det.records.results import ResultsFile
from condinit_det.utils.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from fake_stage import FAKE, FakeStage, score  # noqa: E402
from forked_tool import run_tool  # noqa: E402
from table_text import unpadded  # noqa: E402

HUGE = "100000000"  # x the config's learning rate: the tiny models diverge within a few steps


def _args(out, *argv, **values):
    args = build_parser().parse_args(["--config-file", "fake.cfg", *argv, f"output_dir={out}"])
    for key, value in values.items():
        setattr(args, key, value)
    return args


def _diverges(run_dir):
    ResultsFile(run_dir).add({"kind": "fake", "iteration": 4, "arm": "mimetic", "score": 1.0})
    note_failure(run_dir, FloatingPointError("Loss became infinite or NaN at iteration=5!"), rank=1, iteration=5)
    time.sleep(0.01)  # the other process's note comes later: the divergence is the cause
    note_failure(run_dir, RuntimeError("Connection closed by peer"), rank=0, iteration=5)
    raise RuntimeError("process 1 terminated")


# ---------------------------------------------------------------------------------------------
# Planning
# ---------------------------------------------------------------------------------------------
def test_plan_orders_arms_seeds_and_the_lr_scan(tmp_path):
    experiment = plan_experiment(FakeStage(), _args(tmp_path, "--arm", "all", "--seeds", "0-1", "--lr-scale", "0.5,1"))
    assert experiment.runs == [RunSpec(a, s) for s in (0, 1) for a in PAPER_ARMS] + [
        RunSpec(a, 0, 0.5) for a in PAPER_ARMS
    ]
    assert experiment.base == str(tmp_path) and experiment.length == 10
    assert [r.path(str(tmp_path)) for r in experiment.runs][-1] == str(tmp_path / "conditioned" / "seed0-lr0.5")
    single = plan_experiment(FakeStage(), _args(tmp_path, "arm=mimetic", "seed=3"))
    assert single.runs == [RunSpec("mimetic", 3)]  # the config's arm and seed
    listed = plan_experiment(FakeStage(), _args(tmp_path, "--arm", "conditioned,default"))
    assert [r.arm for r in listed.runs] == ["conditioned", "default"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--arm", "best"], "--arm 'best': 'best' is not an arm; accepted: default, mimetic, conditioned"),
        (["--seeds", "a"], "--seeds 'a': expected non-negative integers like '0,1,2' or a range '0-2'"),
        (["--lr-scale", "0"], "--lr-scale '0': expected distinct positive numbers like '0.5,1,2'"),
        (["--bootstrap", "-1"], "--bootstrap -1: expected a number of resamples >= 0"),
        (["--slurm", "--eval-only"], "--slurm submits training runs; run --eval-only directly"),
        (["bogus=1"], "unknown key 'bogus'; accepted:"),
        (["--arm", "mimetic", "length=-1"], "mimetic needs a positive length"),  # a stage check: the same error type
    ],
)
def test_bad_input_is_one_usage_error(tmp_path, argv, message):
    with pytest.raises(UsageError) as error:
        plan_experiment(FakeStage(), _args(tmp_path, *argv))
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_resume_identity_is_checked_before_anything_runs(tmp_path):
    stage = FakeStage()
    assert execute(plan_experiment(stage, _args(tmp_path, "--arm", "conditioned"))) == 0
    from condinit_det.records.identity import write_arm_report

    run_dir = RunSpec("conditioned", 0).path(str(tmp_path))
    write_arm_report(run_dir, {}, {"arm": "conditioned", "seed": 0, "lr_scale": 2.0})
    with pytest.raises(UsageError, match=r"was started with lr_scale=2.0 but this run asks for lr_scale=1.0"):
        plan_experiment(stage, _args(tmp_path, "--arm", "conditioned", "--resume"))
    plan_experiment(stage, _args(tmp_path, "--arm", "conditioned", "--resume", "--allow-changed-run"))


# ---------------------------------------------------------------------------------------------
# Executing: failures are results; resume and retry rules; fresh runs
# ---------------------------------------------------------------------------------------------
def test_a_failure_is_recorded_and_the_experiment_goes_on(tmp_path, capsys):
    stage = FakeStage({"mimetic": _diverges})
    assert execute(plan_experiment(stage, _args(tmp_path, "--arm", "all", "--bootstrap", "0"))) == 1
    assert [s.arm for s in stage.trained] == list(PAPER_ARMS)
    record = failure_of(RunSpec("mimetic", 0).path(str(tmp_path)))
    assert record == {
        "kind": "failed",
        "reason": "diverged",
        "iteration": 5,
        "message": "FloatingPointError: Loss became infinite or NaN at iteration=5!",
        "stage": "fake",
        "arm": "mimetic",
        "seed": 0,
        "lr_scale": 1.0,
        "config": "fake.cfg",
    }
    assert not list(tmp_path.rglob("failure.rank*.json"))  # the notes are consumed
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2:] == [
        "1 of 3 run(s) did not finish:",
        f"  mimetic seed 0: diverged at iteration 5 ({RunSpec('mimetic', 0).path(str(tmp_path))})",
    ]
    plan = json.loads((tmp_path / PLAN_FILENAME).read_text())
    assert plan["stage"] == "fake" and plan["length"] == {"unit": "iteration", "total": 10}
    assert plan["stage_description"] == FAKE.to_dict()
    assert [r["dir"] for r in plan["runs"]] == [f"{a}/seed0" for a in PAPER_ARMS]
    assert (tmp_path / "report" / "report.md").is_file()

    # --resume: finished runs are skipped, the diverged one is not retried (the command still fails).
    stage.trained.clear()
    assert execute(plan_experiment(stage, _args(tmp_path, "--arm", "all", "--resume", "--bootstrap", "0"))) == 1
    assert stage.trained == []
    # --retry-failed: moved aside, trained afresh.
    stage.script.clear()
    assert execute(plan_experiment(stage, _args(tmp_path, "--arm", "all", "--retry-failed", "--bootstrap", "0"))) == 0
    assert stage.trained == [RunSpec("mimetic", 0)]
    aside = Path(RunSpec("mimetic", 0).path(str(tmp_path)) + ".failed0")
    assert aside.is_dir() and is_set_aside(aside.name) and failure_of(str(aside))["iteration"] == 5


def test_an_error_is_resumed_and_its_record_goes(tmp_path):
    calls = []

    def out_of_memory(run_dir):
        calls.append(run_dir)
        if len(calls) == 1:
            raise MemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    stage = FakeStage({"conditioned": out_of_memory})
    args = _args(tmp_path, "--arm", "conditioned", "--seeds", "1")
    assert execute(plan_experiment(stage, args)) == 1
    run_dir = RunSpec("conditioned", 1).path(str(tmp_path))
    failure = failure_of(run_dir)
    assert failure["reason"] == "error" and failure["message"].startswith("MemoryError: CUDA out of memory")
    assert execute(plan_experiment(stage, _args(tmp_path, "--arm", "conditioned", "--seeds", "1", "--resume"))) == 0
    assert (
        len(calls) == 2
        and failure_of(run_dir) is None
        and [r["kind"] for r in ResultsFile(run_dir).records()] == ["fake", "fake"]
    )


def test_a_fresh_run_never_starts_over_an_earlier_one(tmp_path):
    stage = FakeStage()
    assert execute(plan_experiment(stage, _args(tmp_path, "--arm", "default"))) == 0
    run_dir = Path(RunSpec("default", 0).path(str(tmp_path)))
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    with pytest.raises(UsageError, match=r"seed0 holds a run \(.*results.json.*\): continue it with --resume"):
        plan_experiment(stage, _args(tmp_path, "--arm", "default"))
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before and len(stage.trained) == 1
    # another arm into the same experiment directory is a fresh run of its own directory: accepted
    assert execute(plan_experiment(stage, _args(tmp_path, "--arm", "conditioned"))) == 0


def test_an_experiment_grows_only_with_runs_of_its_setup(tmp_path):
    stage = FakeStage()
    assert execute(plan_experiment(stage, _args(tmp_path, "--arm", "default,conditioned"))) == 0
    # a one-arm command inside the experiment keeps the other runs in the plan
    assert execute(plan_experiment(stage, _args(tmp_path, "--arm", "default", "--resume"))) == 0
    plan = json.loads((tmp_path / PLAN_FILENAME).read_text())
    assert [r["dir"] for r in plan["runs"]] == ["default/seed0", "conditioned/seed0"]
    assert plan["setup"] == {"length": "10"}
    # more seeds of another setup would pool with runs they do not match: refused, naming the key
    with pytest.raises(UsageError, match=r"holds runs of another setup \(length: 10 vs 12\): runs of two setups"):
        plan_experiment(
            stage, _args(tmp_path, "--arm", "default,conditioned", "--seeds", "0,1", "--resume", "length=12")
        )
    with pytest.raises(UsageError, match="length: 10 vs 12"):  # so would one arm resumed with a longer schedule
        plan_experiment(stage, _args(tmp_path, "--arm", "default", "--resume", "length=12"))
    # the same setup extends it; every run resumed at once may change it (a longer schedule for all)
    assert (
        execute(plan_experiment(stage, _args(tmp_path, "--arm", "default,conditioned", "--seeds", "0,1", "--resume")))
        == 0
    )
    assert len(json.loads((tmp_path / PLAN_FILENAME).read_text())["runs"]) == 4
    plan_experiment(stage, _args(tmp_path, "--arm", "default,conditioned", "--seeds", "0,1", "--resume", "length=12"))


def test_an_element_trains_its_run_alone(tmp_path):
    stage = FakeStage()
    experiment = plan_experiment(stage, _args(tmp_path, "--arm", "all"))
    element = experiment.only(RunSpec("mimetic", 0))
    assert execute(element) == 0
    assert stage.trained == [RunSpec("mimetic", 0)]
    assert not (tmp_path / PLAN_FILENAME).exists() and not (tmp_path / "report").exists()


def test_eval_only_evaluates_every_planned_run(tmp_path):
    stage = FakeStage()
    assert execute(plan_experiment(stage, _args(tmp_path, "--arm", "default,conditioned", "--eval-only"))) == 0
    assert [
        len(ResultsFile(RunSpec(a, 0).path(str(tmp_path))).records("fake_eval")) for a in ("default", "conditioned")
    ] == [1, 1]
    assert not stage.trained and not (tmp_path / PLAN_FILENAME).exists()


def test_failure_summary_names_the_lr_scale():
    from condinit_det.launch.run import Outcome

    outcome = Outcome(RunSpec("conditioned", 1, 2.0), "/x", {"reason": "error", "message": "MemoryError: y"})
    assert failure_summary([outcome]) == [
        "1 of 1 run(s) did not finish:",
        "  conditioned seed 1 lr scale 2: failed: MemoryError: y (/x)",
    ]


def test_dry_run_describes_every_run_and_writes_nothing(tmp_path):
    stage = FakeStage({"mimetic": _diverges})
    execute(plan_experiment(stage, _args(tmp_path, "--arm", "all", "--bootstrap", "0")))
    text = describe_plan(
        plan_experiment(
            stage,
            _args(
                tmp_path,
                "--arm",
                "all",
                "--seeds",
                "0,1",
                "--resume",
                "--step-time",
                "0.5",
                "--num-gpus",
                "2",
                "--cpus-per-task",
                "4",
            ),
        )
    )
    plan, cost = text.split("\n\n", 1)
    lines = plan.splitlines()
    assert lines[0] == (
        f"Plan of {tmp_path} (fake, fake.cfg): 6 run(s) of 10 iterations (20 optimizer steps) each; "
        "2 process(es) per run on cpu"
    )
    assert lines[1].split() == ["default/seed0", "skip:", "finished"]
    assert " ".join(lines[2].split()).startswith("mimetic/seed0 skip: diverged at iteration 5 earlier")
    assert lines[4].split() == ["default/seed1", "train"]
    assert lines[-1] == "3 of 6 run(s) would train; nothing was written"
    assert not (tmp_path / "default" / "seed1").exists()
    # the three runs to train: 20 steps x 0.5 s, each on the 4 CPUs given (a CPU run is priced in CPU-hours)
    rows = {
        cells[0]: cells[1:]
        for cells in (
            [c.strip() for c in line.strip("|").split("|")] for line in cost.splitlines() if line.startswith("|")
        )
    }
    assert rows["run"][2:] == ["CPUs", "wall h:mm", "CPU-hours"], cost
    assert rows["default/seed1"][:3] == rows["conditioned/seed1"][:3] == ["fake", "20", "4"], cost
    assert rows["total (3 runs)"][1] == "60" and rows["total (3 runs)"][4] == f"{3 * 10 * 4 / 3600:.2f}"
    assert "default/seed0" not in rows
    assert "given: --step-time 0.5" in cost


# ---------------------------------------------------------------------------------------------
# A Slurm element carries plain data: queued by one version, started by the next
# ---------------------------------------------------------------------------------------------
def test_a_queued_slurm_element_starts_after_a_class_of_the_plan_changed(tmp_path, monkeypatch):
    import dataclasses
    import io
    import pickle

    from submitit.helpers import DelayedSubmission

    from condinit_det.launch import plan, slurm

    command = "condinit-train --config-file fake.cfg --arm all --lr-scale 0.5,1 --slurm"
    experiment = plan_experiment(FakeStage(), _args(tmp_path, "--arm", "all", "--lr-scale", "0.5,1", command=command))
    spec = RunSpec("mimetic", 0, 0.5)
    element = slurm.RunElement(slurm.element_description(experiment, spec))
    DelayedSubmission(element).dump(tmp_path / "queued.pkl")  # what submitit keeps for the element

    class OnlyTheElement(pickle.Unpickler):  # every other class of the package (Experiment, the stage) is refused
        def find_class(self, module, name):
            assert (module, name) == ("condinit_det.launch.slurm", "RunElement"), (module, name)
            return super().find_class(module, name)

    assert OnlyTheElement(io.BytesIO(pickle.dumps(element))).load().description == element.description

    @dataclasses.dataclass
    class Changed(plan.Experiment):  # the next version's plan, with a field the queued version did not have
        retries: int = 0

    monkeypatch.setattr(plan, "Experiment", Changed)
    queued = DelayedSubmission.load(tmp_path / "queued.pkl").function
    started = slurm.element_experiment(queued.description)
    assert isinstance(started, Changed) and started.retries == 0
    assert started.runs == [spec] and started.element and started.args.resume and not started.args.slurm
    assert started.run_dir(spec) == experiment.run_dir(spec) == queued.run_dir

    older = slurm.RunElement({**queued.description, "format": 0, "version": "0.0.1"})
    with pytest.raises(RuntimeError) as error:
        older()
    message = str(error.value)
    assert "\n" not in message and "queued by condinit-det 0.0.1 (element format 0)" in message
    assert f"(element format {slurm.ELEMENT_FORMAT}); submit it again with: {command}" in message


# ---------------------------------------------------------------------------------------------
# A third stage: status and report read it through its descriptor alone
# ---------------------------------------------------------------------------------------------
def test_a_third_stage_appears_in_status_and_in_the_report(tmp_path):
    exp = tmp_path / "exp"
    argv = ["--arm", "default,conditioned", "--seeds", "0,1", "--bootstrap", "0", f"output_dir={exp}"]
    done = subprocess.run(_fake_command(*argv), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    # condinit-status, in a process that never imported the fake stage: the plan describes it
    status = subprocess.run(
        [sys.executable, "-m", "condinit_det.commands.status", str(exp), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert status.returncode == 0, status.stderr[-2000:]
    runs = {(r["arm"], r["seed"]): r for r in json.loads(status.stdout)["runs"]}
    assert {r["state"] for r in runs.values()} == {"finished"} and len(runs) == 4
    got = runs[("conditioned", 1)]
    assert (got["stage"], got["unit"], got["last"], got["total"]) == ("fake", "iteration", 10, 10)
    assert got["evaluation"] == {"at": 10, "score": score("conditioned", 1, 10)}
    table = subprocess.run(
        [sys.executable, "-m", "condinit_det.commands.status", str(exp)], capture_output=True, text=True, timeout=300
    ).stdout
    assert f"score {score('default', 0, 10):.2f} @it 10" in table
    # condinit-compare, likewise: the stage's title, table, curves and paired statistics
    compare = subprocess.run(
        [sys.executable, "-m", "condinit_det.commands.compare", str(exp), "--bootstrap", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert compare.returncode == 0, compare.stderr[-2000:]
    assert "## Fake (dataset not recorded)" in compare.stdout  # the stage's title up to its colon
    rows = list(csv.DictReader((exp / "report" / "stats.csv").open()))
    row = next(r for r in rows if r["arm"] == "conditioned" and r["metric"] == "score")
    assert row["stage"] == "fake" and float(row["mean_difference"]) == pytest.approx(5.0)
    assert (exp / "report" / "score.png").is_file()


def test_a_stage_description_no_stage_could_have_is_refused():
    from condinit_det.stage import DETECTION, StageDescriptor

    described = DETECTION.to_dict()
    assert StageDescriptor.from_dict(described) == DETECTION
    for change in ({"unit": "step"}, {"headline": []}, {"per_image": "pixels"}, {"headline": ["nope"]}):
        with pytest.raises(ValueError, match="^not a stage description"):
            StageDescriptor.from_dict({**described, **change})


# ---------------------------------------------------------------------------------------------
# One owner per run
# ---------------------------------------------------------------------------------------------
_COMMAND = """
import sys
sys.path.insert(0, {tests!r})
from fake_stage import FakeStage
from condinit_det.launch.command import run_command
sys.exit(run_command(FakeStage, sys.argv[1:]))
"""


def _fake_command(*argv):
    code = _COMMAND.format(tests=str(ROOT / "tests"))
    return [sys.executable, "-c", code, "--config-file", "fake.cfg", *argv]


def test_a_second_process_is_refused_and_the_first_owns_the_run(tmp_path):
    from test_run_lock import read_owner

    hold = tmp_path / "release"
    argv = ["--arm", "conditioned", f"output_dir={tmp_path / 'exp'}", f"hold={hold}"]
    first = subprocess.Popen(_fake_command(*argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = RunSpec("conditioned", 0).path(str(tmp_path / "exp"))
    deadline = time.time() + 120
    while (read_owner(run_dir) or {}).get("pid") != first.pid:
        assert first.poll() is None and time.time() < deadline, first.communicate()
        time.sleep(0.1)
    second = subprocess.run(_fake_command("--resume", *argv), capture_output=True, text=True, timeout=300)
    assert second.returncode == 2, second.stderr[-2000:]
    line = second.stderr.strip().splitlines()[-1]
    assert line.startswith("-c: error: ") and f"{run_dir} is in use by pid {first.pid} on host" in line
    assert not ResultsFile(run_dir).exists()  # the second process touched nothing
    # In an experiment the run in use is named, the others go on, and the command says so.
    other = subprocess.run(
        _fake_command("--resume", "--arm", "default,conditioned", f"output_dir={tmp_path / 'exp'}"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert other.returncode == 1 and "conditioned seed 0: not trained here:" in other.stderr
    assert ResultsFile(RunSpec("default", 0).path(str(tmp_path / "exp"))).records("fake")
    hold.write_text("")
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err[-2000:]
    assert [r["iteration"] for r in ResultsFile(run_dir).records("fake")] == [5, 10]
    assert read_owner(run_dir) is None  # released: the record is emptied


# ---------------------------------------------------------------------------------------------
# The command line of every training command
# ---------------------------------------------------------------------------------------------
def _help(command):
    proc = subprocess.run(
        [sys.executable, "-m", command, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONWARNINGS="ignore", COLUMNS="120"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _shared_part(text):
    # the option list after the command's own description and before its examples
    return text.split("options:", 1)[1].split("Examples:", 1)[0]


def test_both_training_commands_share_their_flags():
    detection = _help("condinit_det.commands.train")
    pretrain = _help("condinit_det.commands.pretrain")
    strip = {"detection": detection, "pretrain": pretrain}
    for text in strip.values():
        for flag in (
            "--arm",
            "--seeds",
            "--lr-scale",
            "--bootstrap",
            "--retry-failed",
            "--allow-changed-run",
            "--allow-shared-checkpoint",
            "--trust-pickle",
            "--dry-run",
            "--slurm",
            "--nodes",
            "--resume",
            "--eval-only",
        ):
            assert flag in text
    a, b = _shared_part(detection), _shared_part(pretrain)
    config_a = a.split("--resume", 1)[1]
    config_b = b.split("--resume", 1)[1]
    assert config_a == config_b  # every flag after --config-file: one text, one default
    assert "Default: 1000" in config_a and "detection only (pretraining starts from random weights)" in config_a


@pytest.mark.parametrize(
    "command, config",
    [
        ("train", ROOT / "tests" / "tiny_train_config.py"),
        ("pretrain", ROOT / "configs" / "demo" / "pretrain_vit_tiny.py"),
    ],
)
def test_flags_may_follow_the_overrides(tmp_path, capsys, command, config):
    main = importlib.import_module(f"condinit_det.commands.{command}").main
    rc = main(["--config-file", str(config), f"train.output_dir={tmp_path}", "--dry-run", "--arm", "default,mimetic"])
    out = capsys.readouterr().out
    assert rc == 0 and out.startswith(f"Plan of {tmp_path} ") and "2 of 2 run(s) would train" in out, out
    assert not list(tmp_path.iterdir())


def test_a_yacs_value_in_scientific_notation_is_a_value_not_a_flag():
    from condinit_det.launch.arguments import build_parser, parse_arguments

    argv = ["--config-file", "c.yaml", "SOLVER.BASE_LR", "-1e-3", "--resume", "A.B", "-inf", "C", "-1", "--dry-run"]
    args = parse_arguments(build_parser(), argv)
    assert args.opts == ["SOLVER.BASE_LR", "-1e-3", "A.B", "-inf", "C", "-1"] and args.resume and args.dry_run
    with pytest.raises(SystemExit):  # a misspelt flag is still one
        parse_arguments(build_parser(), ["--config-file", "c.yaml", "--dry-rn"])


# ---------------------------------------------------------------------------------------------
# End to end, both stages
# ---------------------------------------------------------------------------------------------
def _tiny_classification(tmp_path):
    from condinit_det.data.classification import ShapesClsSpec, generate_classification_dataset

    spec = ShapesClsSpec(image_size=32, min_size=14.0, max_size=22.0, center_jitter=3.0, distractor_size=(4.0, 7.0))
    return str(generate_classification_dataset(tmp_path / "shapes", num_train=32, num_val=8, spec=spec))


def _command(stage, tmp_path, exp):
    """(tool, argv without output) of a tiny two-step experiment of ``stage``."""
    if stage == "detection":
        return ROOT / "tools" / "train_net.py", [
            "--config-file",
            str(ROOT / "tests" / "tiny_train_config.py"),
            "train.max_iter=3",
            "train.eval_period=1",
            f"train.output_dir={exp}",
        ]
    overrides = {
        "data.root": _tiny_classification(tmp_path),
        "data.img_size": 32,
        "model.kwargs.img_size": 32,
        "model.kwargs.depth": 1,
        "train.output_dir": exp,
        "train.epochs": 2,
        "train.batch_size": 8,
        "train.workers": 0,
        "train.log_period": 2,
        "train.eval_batch_size": 8,
        "scheduler.warmup_epochs": 0,
    }
    return ROOT / "tools" / "pretrain_net.py", [
        "--config-file",
        str(ROOT / "configs" / "demo" / "pretrain_vit_tiny.py"),
        *[f"{k}={v}" for k, v in overrides.items()],
    ]


def _tool(tool, argv, cwd):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = run_tool(tool, *argv, cwd=cwd, env=env)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "stage, unit, total, evaluations",
    [
        ("detection", "iteration", 3, ("ap", "iteration", [1, 2, 3])),
        ("pretrain", "epoch", 2, ("cls", "epoch", [1, 2])),
    ],
)
def test_experiment_with_a_diverging_lr(tmp_path, stage, unit, total, evaluations):
    exp = tmp_path / "exp"
    tool, argv = _command(stage, tmp_path, exp)
    # flags before the trailing key=value overrides
    argv = [*argv[:2], "--arm", "default,scale_matched", "--lr-scale", f"1,{HUGE}", "--bootstrap", "0", *argv[2:]]
    rc, out, err = _tool(tool, argv, tmp_path)
    assert rc == 1, err[-3000:]
    plan = json.loads((exp / PLAN_FILENAME).read_text())
    assert plan["stage"] == stage and plan["length"] == {"unit": unit, "total": total} and len(plan["runs"]) == 4
    kind, x, values = evaluations
    for arm in ("default", "scale_matched"):  # every run at the config's learning rate finished
        assert [r[x] for r in ResultsFile(RunSpec(arm, 0).path(str(exp))).records(kind)] == values
    scan = [RunSpec(arm, 0, float(HUGE)) for arm in ("default", "scale_matched")]
    diverged = [s for s in scan if (failure_of(s.path(str(exp))) or {}).get("reason") == "diverged"]
    assert diverged, [failure_of(s.path(str(exp))) for s in scan]
    first = failure_of(diverged[0].path(str(exp)))
    assert f"{diverged[0].arm} seed 0 lr scale 1e+08: diverged at iteration {first['iteration']}" in err
    md = (exp / "report" / "report.md").read_text()
    assert f"diverged at iteration {first['iteration']}" in md.split("### Learning-rate sensitivity")[1]
    assert "| scale_matched |" in unpadded(md)  # the control arm is compared like any arm
    assert "Traceback" in (Path(diverged[0].path(str(exp))) / "log.txt").read_text()

    # --resume: nothing is retrained; the diverged runs are named and still fail the command.
    rc, out, err = _tool(tool, [*argv[:2], "--resume", *argv[2:]], tmp_path)
    assert rc == 1 and "not retried" in out + err and (out + err).count("already finished") == 2
    # --retry-failed: the diverged runs are moved aside and trained afresh.
    rc, out, err = _tool(tool, [*argv[:2], "--retry-failed", *argv[2:]], tmp_path)
    assert rc == 1 and "moved aside" in out + err
    for s in diverged:
        assert Path(s.path(str(exp)) + ".failed0").is_dir() and failure_of(s.path(str(exp))) is not None
    assert ".failed0" not in (exp / "report" / "report.md").read_text()
