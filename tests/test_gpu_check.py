"""tools/gpu_check.py, tools/gpu_session.sh and the gpu marker, where there is no CUDA device."""

import importlib.util
import json
import os
import re
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
    proc = _run(
        "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rs", os.path.join("tests", "test_gpu.py")
    )
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "16 skipped" in proc.stdout and "passed" not in proc.stdout and "failed" not in proc.stdout
    assert "needs a CUDA device (make gpu-check)" in proc.stdout


# ---- tools/gpu_check.py's pieces that need no device ----


def _gpu_check_module():
    spec = importlib.util.spec_from_file_location("gpu_check", os.path.join(ROOT, "tools", "gpu_check.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.test_gpu" name="test_a[float32]" time="1.5"/>
<testcase classname="tests.test_gpu" name="test_b" time="0.2"><failure message="AssertionError: off by 2&#10;more">
trace</failure></testcase>
<testcase classname="tests.test_gpu" name="test_c" time="0.0"><skipped message="needs 2 CUDA devices"/></testcase>
</testsuite></testsuites>"""


def test_verdicts_from_the_junit_report(tmp_path):
    gpu_check = _gpu_check_module()
    (tmp_path / "junit.xml").write_text(JUNIT)
    assert list(gpu_check.junit_verdicts(str(tmp_path / "junit.xml"))) == [
        ("PASS", "test_a[float32]", 1.5, ""),
        ("FAIL", "test_b", 0.2, "AssertionError: off by 2"),
        ("SKIP", "test_c", 0.0, "needs 2 CUDA devices"),
    ]


def test_a_timeout_keeps_the_verdicts_of_the_tests_that_finished(monkeypatch, tmp_path):
    gpu_check = _gpu_check_module()
    partial = (
        b"============ test session starts ============\n"
        b"tests/test_gpu.py::test_arm[tf32_off-conditioned-float32] PASSED    [  6%]\n"
        b"tests/test_gpu.py::test_detection FAILED    [ 12%]\n"
        b"tests/test_gpu.py::test_ddp SKIPPED (needs 2 CUDA devices)    [ 18%]\n"
        b"tests/test_gpu.py::test_pretraining[float16] "
    )

    def run_past_the_limit(cmd, **kwargs):
        assert "-v" in cmd and f"--junitxml={tmp_path / 'kept.xml'}" in cmd and kwargs["timeout"] == 30
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"], output=partial)

    monkeypatch.setattr(gpu_check.subprocess, "run", run_past_the_limit)
    assert list(gpu_check.run_tests(30, junitxml=str(tmp_path / "kept.xml"))) == [
        ("PASS", "test_arm[tf32_off-conditioned-float32]", 0.0, "finished before the timeout"),
        ("FAIL", "test_detection", 0.0, "finished before the timeout"),
        ("SKIP", "test_ddp", 0.0, "finished before the timeout"),
        ("FAIL", "tests/test_gpu.py", 30.0, "timed out after 30 s"),
    ]


def test_the_json_verdicts_are_counted_and_marked_complete(tmp_path):
    gpu_check = _gpu_check_module()
    path = str(tmp_path / "check.json")
    checks = [
        {"verdict": "PASS", "name": "a", "seconds": 1.0, "detail": ""},
        {"verdict": "SLOW", "name": "bench vitdet_b", "seconds": 9.0, "detail": "build 1.00 s"},
        {"verdict": "PASS", "name": "b", "seconds": 2.0, "detail": ""},
    ]
    gpu_check.write_json(path, {"device": "GPU", "torch": "2.11.0"}, checks[:1], complete=False)
    with open(path) as f:
        assert json.load(f) == {
            "device": "GPU",
            "torch": "2.11.0",
            "checks": checks[:1],
            "counts": {"PASS": 1},
            "complete": False,
        }
    gpu_check.write_json(path, {"device": "GPU"}, checks, complete=True)
    with open(path) as f:
        written = json.load(f)
    assert written["counts"] == {"PASS": 2, "SLOW": 1} and written["complete"]
    assert os.listdir(tmp_path) == ["check.json"]


def test_gpu_check_refuses_a_test_timeout_below_one_second():
    proc = _run(os.path.join("tools", "gpu_check.py"), "--test-timeout", "0")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "gpu_check.py: error: --test-timeout must be a positive number of seconds, got 0"
    )


# ---- tools/gpu_session.sh: everything but the GPU ----

SESSION = os.path.join(ROOT, "tools", "gpu_session.sh")
SESSION_FILES = {
    "session.log",
    "environment.txt",
    "install.log",
    "gpu_tests.xml",
    "gpu_tests.json",
    "init_bench.json",
    "step_bench.json",
    "summary.json",
}
# Stands for the GPU machine's interpreter: records each call, answers as the real programs would end, and
# sleeps where FAKE_HANG names the part.
FAKE_PYTHON = r"""#!/usr/bin/env bash
echo "$*" >> "$FAKE_CALLS"
case "$*" in
  *gpu_check.py*--no-bench*)
    [[ "${FAKE_HANG:-}" == tests ]] && sleep 300
    echo "PASS  test_arm  (0.1 s)"; echo "gpu-check: 1 PASS" ;;
  *gpu_check.py*--no-tests*) echo "gpu-check: 3 PASS" ;;
  *bench_gpu_step.py*)
    while [[ $# -gt 0 ]]; do [[ "$1" == --output ]] && echo '{"recipes": []}' > "$2"; shift; done
    echo "step bench: 4 recipes" ;;
  *"-m pip list"*) echo "fake-package==1.0" ;;
  *"-c "*) echo "torch 2.11.0 cuda 13.0 available True devices 1" ;;
  *) echo "unexpected call: $*" >&2; exit 3 ;;
esac
"""


@pytest.fixture
def fake_machine(tmp_path):
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    step_bench = tmp_path / "bench_gpu_step.py"
    step_bench.write_text("")
    return {
        "python": str(python),
        "step_bench": str(step_bench),
        "calls": str(tmp_path / "calls"),
        "out": str(tmp_path / "out"),
    }


def _session(fake, *argv, hang=None):
    env = dict(os.environ, FAKE_CALLS=fake["calls"], FAKE_HANG=hang or "")
    env.pop("OUT", None)
    proc = subprocess.run(
        ["bash", SESSION, "--python", fake["python"], "--out", fake["out"], "--step-bench", fake["step_bench"], *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    with open(os.path.join(fake["out"], "summary.json")) as f:
        summary = json.load(f)
    with open(fake["calls"]) as f:
        calls = f.read().splitlines()
    return proc, {p["part"]: p for p in summary["parts"]}, summary, calls


def test_scripts_parse():
    for script in ("gpu_session.sh", "setup_env.sh", "wheelhouse.sh"):
        proc = subprocess.run(["bash", "-n", os.path.join(ROOT, "tools", script)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_session_help_names_the_parts_and_outputs():
    proc = subprocess.run(["bash", SESSION, "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("The GPU check as one prepared call")
    for word in ("--build-wheelhouse", "--dry-run", "--budgets", *sorted(SESSION_FILES)):
        assert word in proc.stdout, word


def test_session_runs_every_part_in_order_within_its_budget(fake_machine):
    proc, parts, summary, calls = _session(fake_machine, "--no-install")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(parts) == ["environment", "install", "tests", "init_bench", "step_bench"]
    assert [p["status"] for p in parts.values()] == ["passed", "skipped", "passed", "passed", "passed"]
    assert parts["tests"]["detail"] == "gpu-check: 1 PASS" and parts["install"]["detail"] == "--no-install"
    assert summary["budget_s"] == 540
    out = fake_machine["out"]
    gpu_calls = [c.split() for c in calls if "gpu_check.py" in c]
    tests_call, bench_call = gpu_calls
    assert tests_call[1:3] == ["--no-bench", "--test-timeout"] and tests_call[4:] == [
        "--json",
        f"{out}/gpu_tests.json",
        "--junitxml",
        f"{out}/gpu_tests.xml",
    ]
    # the tests end 20 s before their part: 15 + 75 + 180 s less what the earlier parts took
    assert 230 <= int(tests_call[3]) <= 250 and parts["tests"]["limit_s"] == int(tests_call[3]) + 20
    assert bench_call[1:] == ["--no-tests", "--json", f"{out}/init_bench.json"]
    (step_call,) = [c.split() for c in calls if "bench_gpu_step.py" in c]
    assert step_call[1:6] == ["--device", "cuda", "--output", f"{out}/step_bench.json", "--budget"]
    assert int(step_call[6]) == parts["step_bench"]["limit_s"] - 30
    # time the fast parts left unused went to the step bench: it may end when the whole budget is spent
    assert parts["step_bench"]["limit_s"] > 180
    assert set(os.listdir(out)) <= SESSION_FILES and len(os.listdir(out)) <= 8
    with open(os.path.join(out, "environment.txt")) as f:
        environment = f.read()
    assert "torch 2.11.0 cuda 13.0 available True devices 1" in environment and "fake-package==1.0" in environment
    with open(os.path.join(out, "session.log")) as f:
        log = f.read()
    assert log.count("gpu_session: == ") == 4 and "gpu-check: 3 PASS" in log


def test_a_part_past_its_budget_is_stopped_and_the_others_still_run(fake_machine):
    proc, parts, summary, _ = _session(
        fake_machine,
        "--no-install",
        "--budgets",
        "environment=5,install=0,tests=6,init_bench=10,step_bench=10",
        hang="tests",
    )
    assert proc.returncode == 1
    assert parts["tests"]["status"] == "timed_out" and parts["tests"]["exit_code"] == 124
    assert parts["tests"]["detail"] == f"stopped at its limit of {parts['tests']['limit_s']} s"
    assert parts["init_bench"]["status"] == "passed" and parts["step_bench"]["status"] == "passed"
    assert summary["budget_s"] == 31 and summary["seconds"] <= 31 + 5
    assert "1 part(s) failed or timed out" in proc.stdout


def test_a_missing_wheelhouse_fails_the_install_and_the_other_parts_still_run(fake_machine, tmp_path):
    proc, parts, _, calls = _session(fake_machine, "--wheelhouse", str(tmp_path / "none"), "--budgets", "init_bench=0")
    assert proc.returncode == 1
    assert parts["install"]["status"] == "failed" and parts["install"]["detail"] == (
        f"no wheelhouse at {tmp_path / 'none'} (build it first: bash tools/gpu_session.sh --build-wheelhouse)"
    )
    assert parts["tests"]["status"] == "passed" and parts["step_bench"]["status"] == "passed"
    # a budget of 0 skips its part
    assert parts["init_bench"]["status"] == "skipped" and parts["init_bench"]["detail"] == "budget 0"
    assert not [c for c in calls if "--no-tests" in c]


def test_session_dry_run_checks_the_wheelhouse(tmp_path):
    wheels = tmp_path / "whl"
    wheels.mkdir()
    (wheels / "condinit_det-0.1.0-py3-none-any.whl").write_bytes(b"x" * 1000)
    dry = ["bash", SESSION, "--dry-run", "--wheelhouse", str(wheels), "--out", str(tmp_path / "out")]
    proc = subprocess.run(dry, capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip() == (
        f"gpu_session: no pure-Python sal_detectron2 wheel in {wheels} (bash tools/gpu_session.sh --build-wheelhouse)"
    )
    (wheels / "sal_detectron2-0.7.2-py3-none-any.whl").write_bytes(b"x" * 1000)
    proc = subprocess.run(dry + ["--budgets", "tests=200"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[:6] == [
        f"gpu_session: plan, 560 s in all, outputs in {tmp_path / 'out'}:",
        "  environment    15 s",
        "  install        75 s",
        "  tests         200 s",
        "  init_bench     90 s",
        "  step_bench    180 s",
    ]
    assert f"gpu_session: wheelhouse {wheels}: 2 wheels, 0.0 MiB" in proc.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "budgets, message",
    [
        (
            "tests",
            "gpu_session: --budgets: 'tests' is not PART=SECONDS with PART one of: environment install tests "
            "init_bench step_bench",
        ),
        (
            "gpu=10",
            "gpu_session: --budgets: 'gpu=10' is not PART=SECONDS with PART one of: environment install tests "
            "init_bench step_bench",
        ),
        ("tests=1.5", "gpu_session: --budgets: 'tests=1.5': seconds must be a whole number"),
    ],
)
def test_session_refuses_bad_budgets(budgets, message, tmp_path):
    proc = subprocess.run(
        ["bash", SESSION, "--dry-run", "--no-install", "--budgets", budgets], capture_output=True, text=True
    )
    assert proc.returncode == 1 and proc.stderr.strip() == message


@pytest.mark.slow
@pytest.mark.e2e
def test_the_machine_wheelhouse_is_for_python_3_12_and_fits_what_travels(tmp_path, wheel_cache):
    """The wheelhouse --build-wheelhouse makes (the package index is needed): CPython 3.12 manylinux wheels,
    without torch, torchvision, the projects the machine has and what only they pull in. Wheels already in the
    wheel cache (conftest.py) are taken from there."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.run(
        ["bash", SESSION, "--build-wheelhouse", str(tmp_path / "whl")],
        cwd=ROOT,
        env=dict(env, PYTHON=sys.executable, CONDINIT_WHEEL_CACHE=wheel_cache),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    files = os.listdir(tmp_path / "whl")
    projects = {f.split("-")[0].lower().replace("_", "-") for f in files}
    assert {"condinit-det", "sal-detectron2", "fvcore", "iopath", "hydra-core", "pycocotools"} <= projects
    left_to_machine = {
        "torch",
        "torchvision",
        "numpy",
        "scipy",
        "opencv-python-headless",
        "matplotlib",
        "pillow",
        "tensorboard",
        "timm",
    }
    only_theirs = {"grpcio", "fonttools", "kiwisolver", "contourpy", "huggingface-hub", "hf-xet", "triton"}
    assert not projects & (left_to_machine | only_theirs), projects & (left_to_machine | only_theirs)
    for f in files:
        tags = f[: -len(".whl")].split("-")[-3:]
        assert tags[0] in ("py3", "py2.py3", "cp312") or tags[1] == "abi3", f
        assert tags[2] == "any" or "x86_64" in tags[2] and "manylinux" in tags[2], f
    size = re.search(
        r"gpu_session: the wheelhouse is ([\d.]+) MiB and the checkout ([\d.]+) MiB: ([\d.]+) MiB of the "
        r"64 MiB that travel",
        proc.stderr,
    )
    assert (
        size
        and float(size[3]) < 64
        and abs(float(size[1]) - sum(os.path.getsize(tmp_path / "whl" / f) for f in files) / 2**20) < 0.1
    )
