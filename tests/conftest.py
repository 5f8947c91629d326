"""Fixtures shared by several test modules."""

import logging
import os
import shutil
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    """Under pytest-xdist, every process of a worker computes on one thread: two workers whose torch each spreads
    over every CPU slow each other down several times over (OpenMP threads spinning on shared cores). The training
    processes a test starts size their pools from SLURM_CPUS_PER_TASK (condinit_det.utils.threads; the Slurm tests'
    jobs get their own, slurm_env), other processes from OMP_NUM_THREADS. No CPU is pinned, so a worker that waits
    (on a download, on a Slurm job) leaves its core to the other one."""
    if "PYTEST_XDIST_WORKER" not in os.environ or int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2:
        return
    os.environ.update(SLURM_CPUS_PER_TASK="1", OMP_NUM_THREADS="1")
    import torch

    torch.set_num_threads(1)


def _slurm_unavailable():
    """Why Slurm tests cannot run here, or None when the cluster answers."""
    if shutil.which("sbatch") is None or shutil.which("srun") is None:
        return "sbatch/srun are not on PATH (start a one-node Slurm: sudo bash tools/slurm_local.sh start)"
    try:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as e:
        return f"scontrol ping failed: {e}"
    if "is UP" not in ping.stdout:
        conf = os.environ.get("SLURM_CONF", "<unset>")
        return (
            f"the Slurm cluster of SLURM_CONF={conf} does not answer "
            "(export the line tools/slurm_local.sh start prints)"
        )
    return None


@pytest.fixture(autouse=True)
def no_log_handler_on_a_closed_stream():
    """A test that sets up a run's log in this process leaves its handlers on the streams it had; once pytest closes a
    test's captured stream, such a handler would write a logging error into a later test's output (the order of the
    tests a process runs differs under pytest-xdist). They are removed after each test."""
    yield
    loggers = [logging.getLogger()] + [
        logger for logger in list(logging.Logger.manager.loggerDict.values()) if isinstance(logger, logging.Logger)
    ]
    for logger in loggers:
        for handler in list(logger.handlers):
            if getattr(getattr(handler, "stream", None), "closed", False):
                logger.removeHandler(handler)


@pytest.fixture(scope="session")
def slurm_unavailable():
    """Why no Slurm cluster answers here (a str), or None when one does."""
    return _slurm_unavailable()


@pytest.fixture
def slurm_env(slurm_unavailable, monkeypatch, tmp_path):
    """A folder for submitit (``tmp_path``) with the environment jobs inherit: this checkout first on PYTHONPATH.
    Skips the test when no cluster answers."""
    if slurm_unavailable:
        pytest.skip(slurm_unavailable)
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)  # a job's own comes from its allocation
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", REPO + (os.pathsep + path if path else ""))
    return tmp_path


@pytest.fixture(scope="session")
def wheel_cache():
    """The folder tools/wheelhouse.sh keeps downloaded wheels in between runs (``$CONDINIT_WHEEL_CACHE``, default
    ``~/.cache/condinit_det/wheels``): both wheelhouse builds of a run read it and add what they download, so the
    second downloads only the wheels of its own target, and a later run on the same machine only what changed."""
    return os.environ.get("CONDINIT_WHEEL_CACHE") or os.path.expanduser("~/.cache/condinit_det/wheels")


@pytest.fixture(scope="session")
def coco_layout_root(tmp_path_factory):
    """A folder holding a tiny ``coco/`` in the COCO 2017 layout (tests/coco_layout.py): point
    DETECTRON2_DATASETS at it, in a process that imports detectron2.data afterwards, to get it as the
    builtin ``coco_2017_train`` / ``coco_2017_val``."""
    from coco_layout import write_coco_layout

    return write_coco_layout(tmp_path_factory.mktemp("datasets"))


@pytest.fixture(scope="session")
def demo_digits_run(tmp_path_factory):
    """``make demo-digits`` at tiny size, run once (tests/test_digits_demo.py: ``run_demo_digits``); its working
    folder. The digits demo test and the every config end to end test (the two digits configs) read it."""
    from test_digits_demo import run_demo_digits

    return run_demo_digits(tmp_path_factory.mktemp("demo_digits"))


@pytest.fixture(scope="session")
def documented_demo_pair_run(tmp_path_factory):
    """The demo pair as the docs write it, at tiny size, run once (tests/test_docs.py: ``run_documented_demo_pair``):
    {"work", "pretrain", "finetune", "report"} folders. The docs test and the every config end to end test (the two
    configs of the pair) read it."""
    from test_docs import run_documented_demo_pair

    return run_documented_demo_pair(str(tmp_path_factory.mktemp("demo_pair")))


@pytest.fixture(scope="session")
def image_folder_root(tmp_path_factory):
    """A tiny two-class ImageFolder ``<root>/{train,val}/<class>/*.png`` (1 training, 1 evaluation image per class:
    one step of a batch of 2)."""
    from coco_layout import write_image_folder

    return write_image_folder(tmp_path_factory.mktemp("imagefolder"), train_per_class=1)


# Under pytest-xdist (`make test` and `make test-e2e` pass `-n 2 --dist loadgroup`), a group runs on one worker, in
# order: each test file is a group, so a module's fixtures are made once; the tests that read the demo runs (the every
# config test, the docs' demo pair, the digits demo) join the every config test's group, so the runs are made once;
# the tests that share the one-node Slurm (a test there counts the node's free CPUs) are one group, and so are the two
# wheelhouse builds, which share the wheel cache (one reads what the other writes). `make test-e2e` hands out its groups
# in the order of FIRST: the every config runs (two training processes) beside the wheelhouse builds (mostly waiting
# on the package index), then the Slurm tests (up to two jobs at once, the test itself waiting), then the others
# longest first (about 170, 100, 95, 80 and 70 s on the 2-core machine): a worker takes its next group before its
# current one ends, so the groups handed out last must be short for both to end together.
EVERY_CONFIG = "tests/test_configs_end_to_end.py"
SHARED_GROUPS = {
    "tests/test_docs.py::test_the_documented_demo_pair_fine_tunes_each_arm_from_its_own_pretraining": EVERY_CONFIG,
    "tests/test_digits_demo.py::test_make_demo_digits_end_to_end_at_tiny_size": EVERY_CONFIG,
    "tests/test_offline_install.py::test_wheelhouse_holds_every_dependency_as_wheels_without_torch": "wheelhouse",
    "tests/test_offline_install.py::test_offline_install_into_an_environment_with_torch": "wheelhouse",
    "tests/test_gpu_check.py::test_the_machine_wheelhouse_is_for_python_3_12_and_fits_what_travels": "wheelhouse",
}
FIRST = (
    EVERY_CONFIG,
    "wheelhouse",
    "slurm",
    "tests/test_robustness.py",
    "tests/test_exact_resume.py",
    "tests/test_factorial.py",
    "tests/test_pretrain.py",
    "tests/test_multiprocess.py",
)


def xdist_group_of(item) -> str:
    """The pytest-xdist group of a test: "slurm", a shared group of SHARED_GROUPS, or its file."""
    if item.get_closest_marker("slurm") is not None:
        return "slurm"
    return SHARED_GROUPS.get(item.nodeid.split("[")[0], item.nodeid.split("::")[0])


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(xdist_group_of(item)))
    # A stable sort: the order inside a group stays the files' order.
    items.sort(key=lambda item: FIRST.index(xdist_group_of(item)) if xdist_group_of(item) in FIRST else len(FIRST))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """Under --dist loadgroup, stop when a worker's test ids came without their group: the tests would spread over both
    workers, each making the shared runs again (pytest 9.2 with pytest-xdist 3.8)."""
    if node.config.getvalue("dist") != "loadgroup":
        return
    ungrouped = [nodeid for nodeid in ids if "@" not in nodeid.rpartition("]")[2]]
    if ungrouped:
        pytest.exit(
            f"pytest-xdist did not put {ungrouped[0]} (and {len(ungrouped) - 1} more) in a group: this pytest "
            "and pytest-xdist do not group together; install the versions setup.py's test extra asks for "
            "(bash tools/setup_env.sh)",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )
