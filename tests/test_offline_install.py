"""The offline install: a wheelhouse built with tools/wheelhouse.sh, installed by tools/setup_env.sh --offline
into an environment that has torch and torchvision and nothing else of this project's, with no index reachable.

The environment stands for a site's PyTorch: a fresh virtual environment whose only outside packages are
torch, torchvision and what they need, reached through a ``.pth`` file naming a folder of symbolic links
into the running environment (no 5 GB copy of torch). Building the wheelhouse needs the package index.
"""

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import zipfile

import pytest
from packaging.requirements import Requirement

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP_ENV = os.path.join(ROOT, "tools", "setup_env.sh")
WHEELHOUSE = os.path.join(ROOT, "tools", "wheelhouse.sh")
# Any network attempt fails at once: nothing listens on port 9 (discard) here.
DEAD_INDEX = "http://127.0.0.1:9/simple"
# A conditioned arm on a timm model, from the installed package (printed as JSON).
APPLY_ARM = """
import json, torch, timm, condinit_det, detectron2
from condinit_det.init import apply_init, find_attention
model = timm.create_model("vit_tiny_patch16_224", num_classes=10)
report = apply_init(model, "conditioned", seed=0)
site = find_attention(model)[0]
q_block = site.weight("q")[:64].detach().double()
print(json.dumps({"sites": len(report.sites), "q_singular_values": torch.linalg.svdvals(q_block).tolist(),
                  "v_is_identity": torch.equal(site.weight("v").detach(), torch.eye(192)),
                  "condinit_det": condinit_det.__file__, "detectron2": detectron2.__file__}))
"""


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_project(filename):
    return canonical(filename.split("-")[0])


def _run(argv, **kwargs):
    proc = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    assert proc.returncode == 0, f"{argv} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def _offline_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "CONDINIT_VENV", "PYTHON")}
    env.update(PIP_INDEX_URL=DEAD_INDEX, PIP_EXTRA_INDEX_URL=DEAD_INDEX, PIP_RETRIES="0", PIP_TIMEOUT="5")
    env.update(extra)
    return env


def torch_closure():
    """The installed projects torch and torchvision need, recursively (extras followed), themselves included."""
    dists = {canonical(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
    todo, done = [("torch", ()), ("torchvision", ())], set()
    while todo:
        name, extras = todo.pop()
        name = canonical(name)
        if (name, extras) in done or name not in dists:
            continue
        done.add((name, extras))
        for line in dists[name].requires or ():
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("",) + extras):
                todo.append((req.name, tuple(sorted(req.extras))))
    return {name: dists[name] for name, _ in done}


def link_torch_site(folder):
    """A folder of symbolic links to torch, torchvision and their dependencies in the running environment."""
    os.makedirs(folder)
    for dist in torch_closure().values():
        site = str(dist.locate_file(""))
        tops = {str(f).split("/")[0] for f in dist.files or () if not str(f).startswith("..")}
        for top in tops:
            source, target = os.path.join(site, top), os.path.join(folder, top)
            if os.path.exists(source) and not os.path.lexists(target) and not top.endswith(".pth"):
                os.symlink(source, target)
    return folder


def listing(folder):
    return sorted(os.listdir(folder))


def test_print_target_expands_manylinux_to_every_older_glibc():
    out = _run(
        ["bash", WHEELHOUSE, "--print-target", "--python-version", "3.12", "--platform", "manylinux_2_28_x86_64"]
    ).stdout.split()
    assert out[:4] == ["--python-version", "3.12", "--implementation", "cp"]
    platforms = out[5::2]
    assert all(flag == "--platform" for flag in out[4::2])
    assert platforms == [f"manylinux_2_{n}_x86_64" for n in range(28, 4, -1)] + [
        "manylinux2014_x86_64",
        "manylinux2010_x86_64",
        "manylinux1_x86_64",
    ]
    # the legacy alias stands for glibc 2.17; other tags pass as they are; the default is this interpreter
    aarch64 = _run(["bash", WHEELHOUSE, "--print-target", "--platform", "manylinux2014_aarch64"]).stdout.split()[1::2]
    assert aarch64 == [f"manylinux_2_{n}_aarch64" for n in range(17, 4, -1)] + ["manylinux2014_aarch64"]
    assert _run(["bash", WHEELHOUSE, "--print-target", "--platform", "win_amd64"]).stdout.split() == [
        "--platform",
        "win_amd64",
    ]
    assert _run(["bash", WHEELHOUSE, "--print-target"]).stdout.strip() == ""


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "wheelhouse: name the output folder: bash tools/wheelhouse.sh DIR [options] (--help)"),
        (["d", "--python-version", "3"], "wheelhouse: --python-version needs MAJOR.MINOR of a Python 3, e.g. 3.12"),
        (
            ["d", "--platform", "Manylinux"],
            "wheelhouse: --platform needs a wheel platform tag (lower case, digits, _), e.g. manylinux_2_28_x86_64",
        ),
        (["d", "e"], "wheelhouse: one output folder only (got 'd' and 'e')"),
        (
            ["d", "--no-such"],
            "wheelhouse: unknown option '--no-such'; accepted: --python-version, --platform, --exclude, "
            "--torch-version, --torchvision-version, --print-target, --help",
        ),
    ],
)
def test_wheelhouse_refuses_bad_arguments(argv, message, tmp_path):
    proc = subprocess.run(["bash", WHEELHOUSE, *argv], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip() == message
    assert listing(tmp_path) == []


def test_offline_setup_refuses_what_it_cannot_install_from(tmp_path):
    def refusal(*argv, **env):
        proc = subprocess.run(
            ["bash", SETUP_ENV, *argv],
            capture_output=True,
            text=True,
            env=_offline_env(CONDINIT_VENV=str(tmp_path / "venv"), **env),
        )
        assert proc.returncode == 1, proc.stderr
        return proc.stderr.strip()

    assert refusal("--offline", str(tmp_path / "nothing")) == (
        f"setup_env: --offline {tmp_path / 'nothing'}: no such folder (build one with tools/wheelhouse.sh)"
    )
    (tmp_path / "empty").mkdir()
    assert refusal("--offline", str(tmp_path / "empty")) == (
        f"setup_env: --offline {tmp_path / 'empty'}: no condinit_det wheel there; build the folder with "
        "tools/wheelhouse.sh"
    )
    (tmp_path / "empty" / "condinit_det-0.1.0-py3-none-any.whl").write_bytes(b"")
    assert refusal("--offline", str(tmp_path / "empty"), "--python", str(tmp_path / "python")) == (
        f"setup_env: --python {tmp_path / 'python'}: not a working Python interpreter"
    )
    assert refusal("--python", sys.executable) == (
        "setup_env: --python is for --offline (the online setup makes its own venv: CONDINIT_VENV, PYTHON)"
    )
    assert refusal("--bogus").startswith("setup_env: unknown argument '--bogus'; accepted: --offline DIR")
    assert not (tmp_path / "venv").exists()


def test_offline_setup_needs_an_environment_with_torch(tmp_path):
    """An environment without torch is refused before anything is installed into it."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")])
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "condinit_det-0.1.0-py3-none-any.whl").write_bytes(b"")
    bare = str(tmp_path / "bare" / "bin" / "python")
    proc = subprocess.run(
        ["bash", SETUP_ENV, "--offline", str(tmp_path / "wheels"), "--python", bare],
        capture_output=True,
        text=True,
        env=_offline_env(),
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"setup_env: offline mode installs everything but torch and torchvision, and {bare} cannot import them: name "
        "an environment that has the site's PyTorch (--python PATH, or PYTHON=PATH for a new venv)"
    )


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory, wheel_cache):
    """The wheelhouse for this interpreter (the index is needed here, and only here). Downloaded wheels are kept in
    the wheel cache (conftest.py) for the next build."""
    folder = tmp_path_factory.mktemp("wheelhouse")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = _run(
        ["bash", WHEELHOUSE, str(folder)], env=dict(env, PYTHON=sys.executable, CONDINIT_WHEEL_CACHE=wheel_cache)
    )
    return {"folder": str(folder), "stderr": proc.stderr}


@pytest.mark.slow
@pytest.mark.e2e
def test_wheelhouse_holds_every_dependency_as_wheels_without_torch(wheelhouse):
    files = listing(wheelhouse["folder"])
    assert files and all(f.endswith(".whl") for f in files), files
    projects = [wheel_project(f) for f in files]
    assert len(projects) == len(set(projects)), "one version per project"
    # torch, torchvision and what only they pull in stay the site's
    assert not [
        p
        for p in projects
        if p in ("torch", "torchvision", "triton", "sympy", "networkx", "mpmath") or p.startswith(("nvidia-", "cuda-"))
    ], projects
    # the package, detectron2 as pure Python, and the source-only projects built into pure wheels
    pure = {wheel_project(f) for f in files if f.endswith("-none-any.whl")}
    assert {"condinit-det", "sal-detectron2", "fvcore", "iopath", "antlr4-python3-runtime"} <= pure
    # every requirement of the package (test extra included) and of detectron2, but torch and torchvision
    needed = set()
    for name in ("condinit-det", "sal-detectron2"):
        wheel = next(f for f in files if wheel_project(f) == name)
        with zipfile.ZipFile(os.path.join(wheelhouse["folder"], wheel)) as zf:
            metadata = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        for line in re.findall(r"(?m)^Requires-Dist: (.+)$", metadata):
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": "test"}):
                needed.add(canonical(req.name))
    assert needed - {"torch", "torchvision"} <= set(projects), needed - set(projects)
    assert {
        "pytest",
        "pycocotools",
        "faster-coco-eval",
        "timm",
        "submitit",
        "safetensors",
        "shapely",
        "omegaconf",
        "hydra-core",
        "threadpoolctl",
    } <= needed
    with zipfile.ZipFile(os.path.join(wheelhouse["folder"], "sal_detectron2-0.7.2-py3-none-any.whl")) as zf:
        names = zf.namelist()
    assert not [n for n in names if n.endswith((".so", ".pyd")) or n.startswith("tools/")]
    assert re.search(
        r"wheelhouse: \d+ wheels, [\d.]+ MiB, in .* \(left to the site: torch torchvision\)", wheelhouse["stderr"]
    )


@pytest.mark.slow
@pytest.mark.e2e
def test_offline_install_into_an_environment_with_torch(wheelhouse, tmp_path_factory):
    work = tmp_path_factory.mktemp("offline")
    site = link_torch_site(str(work / "torch-site"))
    _run([sys.executable, "-m", "venv", str(work / "base")])
    base = str(work / "base" / "bin" / "python")
    base_purelib = _run([base, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    with open(os.path.join(base_purelib, "torch_site.pth"), "w") as f:
        f.write(site + "\n")
    identity = (
        "import json, torch, torchvision; print(json.dumps([torch.__file__, torch.__version__, "
        "torchvision.__file__, torchvision.__version__]))"
    )
    before = json.loads(_run([base, "-c", identity]).stdout)
    assert before[0].startswith(site)
    base_before = listing(base_purelib)
    outside = str(work / "outside")
    os.makedirs(outside)

    # a new venv made from the base (it sees the base's torch), installed from the folder alone
    venv = str(work / "venv")
    proc = _run(
        ["bash", SETUP_ENV, "--offline", wheelhouse["folder"]],
        cwd=outside,
        env=_offline_env(PYTHON=base, CONDINIT_VENV=venv),
    )
    assert "setup_env: ready (" in proc.stderr and "torch and torchvision untouched" in proc.stderr
    python = os.path.join(venv, "bin", "python")
    assert json.loads(_run([python, "-c", identity], cwd=outside).stdout) == before
    assert listing(base_purelib) == base_before, "the base environment is left as it was"
    installed = {
        canonical(d.metadata["Name"])
        for d in importlib.metadata.distributions(
            path=[_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()]
        )
    }
    assert {"condinit-det", "sal-detectron2", "fvcore", "timm", "pytest"} <= installed
    assert not installed & {"torch", "torchvision"}
    assert _run([python, "-m", "pip", "check"], cwd=outside).stdout.startswith("No broken requirements")

    # the installed package runs from outside the checkout
    env = _offline_env(PATH=os.path.join(venv, "bin") + os.pathsep + os.environ["PATH"])
    assert _run(["condinit-compare", "--help"], cwd=outside, env=env).stdout.startswith("usage: condinit-compare")
    arm = json.loads(_run([python, "-W", "ignore", "-c", APPLY_ARM], cwd=outside, env=env).stdout.splitlines()[-1])
    assert arm["sites"] == 12 and arm["v_is_identity"]
    assert max(abs(s - 1) for s in arm["q_singular_values"]) < 1e-5 and len(arm["q_singular_values"]) == 64
    assert arm["condinit_det"].startswith(venv) and arm["detectron2"].startswith(venv)

    # a second run finds everything in place and changes nothing
    again = _run(
        ["bash", SETUP_ENV, "--offline", wheelhouse["folder"]],
        cwd=outside,
        env=_offline_env(PYTHON=base, CONDINIT_VENV=venv),
    )
    assert "setup_env: installed or changed: \n" in again.stderr
    assert json.loads(_run([python, "-c", identity], cwd=outside).stdout) == before
