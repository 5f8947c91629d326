"""The installed form: the wheel carries every config and the console scripts, and runs outside the checkout.

The wheel is built from a copy of the sources (the checkout is left as it is) with the running
interpreter's setuptools, and installed with pip into a fresh virtual environment before that
environment is given the running environment's packages (torch, detectron2, ...) through a ``.pth``
file, so the install itself sees nothing else. Every command then runs from a folder outside the
checkout, without PYTHONPATH.
"""

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
from table_text import unpadded

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = (
    "condinit-train",
    "condinit-pretrain",
    "condinit-compare",
    "condinit-conditioning",
    "condinit-status",
    "condinit-protocol",
)
SOURCES = ("setup.py", "README.md", "MANIFEST.in", "condinit_det", "configs")


def _run(argv, **kwargs):
    proc = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{argv} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = os.path.join(ROOT, name)
        if os.path.isdir(path):
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy(path, src / name)
    out = tmp_path_factory.mktemp("wheel")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "-q",
            "-w",
            str(out),
            str(src),
        ]
    )
    (found,) = out.glob("condinit_det-*.whl")
    return found


def test_wheel_carries_every_config_and_the_commands(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    prefix = "condinit_det/model_zoo/configs/"
    shipped = sorted(n[len(prefix) :] for n in names if n.startswith(prefix))
    expected = []
    for path, dirs, files in os.walk(os.path.join(ROOT, "configs")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        expected.extend(
            os.path.relpath(os.path.join(path, f), os.path.join(ROOT, "configs")).replace(os.sep, "/") for f in files
        )
    assert shipped == sorted(expected) and len(shipped) > 20
    for script in SCRIPTS:
        assert f"{script} = condinit_det.commands." in entry_points, entry_points
    # only the package: no tests, tools or top-level configs folder
    assert not [n for n in names if n.split("/")[0] in ("tests", "tools", "configs", "bench")]


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """A fresh environment holding the wheel (installed by its own pip), then given this one's packages."""
    env_dir = tmp_path_factory.mktemp("env")
    _run([sys.executable, "-m", "venv", str(env_dir)])
    python = str(env_dir / "bin" / "python")
    _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check", "-q", str(wheel)])
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    import site as this_site

    detectron2 = pytest.importorskip("detectron2")

    ours = this_site.getsitepackages() + [os.path.dirname(os.path.dirname(detectron2.__file__))]
    with open(os.path.join(site, "condinit_test_base_env.pth"), "w") as f:
        f.write("\n".join(dict.fromkeys(p for p in ours if os.path.abspath(p) != ROOT)) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = str(env_dir / "bin") + os.pathsep + env.get("PATH", "")
    work = tmp_path_factory.mktemp("outside")
    return {"python": python, "env": env, "cwd": str(work), "env_dir": str(env_dir)}


@pytest.mark.slow
@pytest.mark.e2e
def test_installed_wheel_runs_outside_the_checkout(installed):
    env_dir, run = installed["env_dir"], lambda argv: _run(argv, env=installed["env"], cwd=installed["cwd"])
    code = (
        "import json, condinit_det; from condinit_det import model_zoo; names = model_zoo.list_configs(); "
        "kinds = [type(model_zoo.get_config(n)).__name__ for n in names]; "
        "print(json.dumps({'package': condinit_det.__file__, 'root': model_zoo.configs_root(), 'kinds': kinds}))"
    )
    info = json.loads(run([installed["python"], "-W", "ignore", "-c", code]).stdout.strip().splitlines()[-1])
    assert info["package"].startswith(env_dir) and info["root"].startswith(env_dir), info
    assert len(info["kinds"]) > 20 and set(info["kinds"]) == {"DictConfig", "CfgNode"}
    for script in SCRIPTS:
        assert run([script, "--help"]).stdout.startswith("usage: " + script)

    # the ViT demo by its zoo name: three arms, two iterations each, then the experiment's report
    out = os.path.join(installed["cwd"], "demo")
    run(
        [
            "condinit-train",
            "--config-file",
            "zoo:demo/mask_rcnn_vit_tiny.py",
            "--arm",
            "all",
            "train.max_iter=2",
            "condinit_analysis.period=0",
            f"train.output_dir={out}",
        ]
    )
    for arm in ("default", "mimetic", "conditioned"):
        with open(os.path.join(out, arm, "seed0", "results.json")) as f:
            final = [r for r in json.load(f)["records"] if r["kind"] == "ap"][-1]
        assert final["iteration"] == 2 and final["arm"] == arm and final["config"] == "zoo:demo/mask_rcnn_vit_tiny.py"
    assert os.path.isfile(os.path.join(out, "report", "report.md"))
    printed = run(["condinit-compare", out, "--output", os.path.join(out, "report2"), "--bootstrap", "0"]).stdout
    assert "| conditioned |" in unpadded(printed) and os.path.isfile(os.path.join(out, "report2", "summary.csv"))
    # a bad zoo name: one error line naming the closest configs
    proc = subprocess.run(
        ["condinit-pretrain", "--config-file", "zoo:demo/pretrain_vit.py"],
        env=installed["env"],
        cwd=installed["cwd"],
        capture_output=True,
        text=True,
    )
    err = proc.stderr.strip()
    assert proc.returncode == 2 and err.startswith("condinit-pretrain: error: --config-file: ") and "\n" not in err
    assert "did you mean demo/pretrain_vit_tiny.py" in err
    assert not os.path.exists(os.path.join(installed["cwd"], "output"))
