"""The package's layers, checked on its import statements (docs/development.md: the layout).

Bottom to top: ``utils`` (the ground) -> ``init``, ``records``, ``stage`` -> ``modeling``, ``evaluation``,
``analysis``, ``data``, ``model_zoo``, ``tracking`` -> the stages ``engine`` and ``pretrain`` -> ``launch`` and
``report`` -> ``commands``. A module imports its own layer or lower ones (the stage interface sits below the stages
that implement it); the stages import nothing from the launcher and never each other; the report reads records (no
training code); no import cycle between any modules, not even through an import inside a function; no ``_private``
name imported from another module.
"""

import ast
import os
from collections import defaultdict, deque

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "condinit_det")
LAYERS = {
    "utils": 0,
    "init": 1,
    "records": 1,
    "stage": 1,
    "modeling": 2,
    "evaluation": 2,
    "analysis": 2,
    "data": 2,
    "model_zoo": 2,
    "tracking": 2,
    "engine": 3,
    "pretrain": 3,
    "launch": 4,
    "report": 4,
    "commands": 5,
}
STAGES = ("engine", "pretrain")
REPORT_READS = ("utils", "init", "records", "stage", "evaluation", "report")


def _module_name(root, path):
    rel = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _walk(node, in_function=False):
    """Every node under ``node``, with whether it lies in a function (runs when called, not when imported)."""
    for child in ast.iter_child_nodes(node):
        inside = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield child, inside
        yield from _walk(child, inside)


def read_imports(package_dir):
    """module -> [(imported module, imported name or None, in a function)] for every import of the package's own
    modules. ``from p import m`` imports the module ``p.m`` where there is one, else a name of ``p``."""
    root, package = os.path.dirname(package_dir), os.path.basename(package_dir)
    paths = {}
    for folder, dirs, files in os.walk(package_dir):
        dirs[:] = [d for d in dirs if d not in ("__pycache__", "configs")]
        paths.update(
            {
                _module_name(root, os.path.join(folder, name)): os.path.join(folder, name)
                for name in files
                if name.endswith(".py")
            }
        )
    found = defaultdict(list)
    for module, path in sorted(paths.items()):
        parts = module.split(".") if path.endswith("__init__.py") else module.split(".")[:-1]
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node, in_function in _walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module
                for alias in node.names:
                    target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base
                    if target.split(".")[0] == package:
                        found[module].append((target, alias.name, in_function))
            elif isinstance(node, ast.Import):
                found[module] += [(a.name, None, in_function) for a in node.names if a.name.split(".")[0] == package]
    return found


def _reachable(graph, start):
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _cycle_through(graph, start, component):
    """The shortest import cycle from ``start`` back to it inside ``component``, e.g. ``"a -> b -> a"``, followed by
    the imports of it that lie in a function."""
    paths, todo = {start: [start]}, deque([start])
    while todo:
        node = todo.popleft()
        for nxt in sorted(graph[node]):
            if nxt == start:
                path = paths[node] + [start]
                lazy = [f"{a} imports {b} in a function" for a, b in zip(path, path[1:]) if graph[a][b]]
                return " -> ".join(path) + (f" ({'; '.join(lazy)})" if lazy else "")
            if nxt in component and nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                todo.append(nxt)


def import_cycles(imports):
    """One cycle per strongly connected component of more than one module of the import graph.

    Imports inside functions count: such an import only defers the circle to the first call (a module importing
    its caller), so it is refused as a module-level one is.
    """
    graph = defaultdict(dict)  # module -> {imported module: True if every import of it lies in a function}
    for module, targets in imports.items():
        for target, _, in_function in targets:
            if target != module:
                graph[module][target] = graph[module].get(target, True) and in_function
    reach = {module: _reachable(graph, module) for module in list(graph)}
    cycles, seen = [], set()
    for module in sorted(reach):
        if module in seen or module not in reach[module]:
            continue
        component = {m for m in reach[module] if module in reach.get(m, ())}
        seen |= component
        cycles.append(_cycle_through(graph, module, component))
    return cycles


IMPORTS = read_imports(PACKAGE)


def _package(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_the_top_level_holds_subpackages_only():
    entries = sorted(e for e in os.listdir(PACKAGE) if e != "__pycache__")
    files = [e for e in entries if os.path.isfile(os.path.join(PACKAGE, e))]
    assert files == ["__init__.py"], files
    packages = [e for e in entries if os.path.isdir(os.path.join(PACKAGE, e))]
    assert sorted(packages) == sorted(LAYERS), "a new subpackage needs its layer here and in the docs"
    for name in packages:  # each says what it owns
        with open(os.path.join(PACKAGE, name, "__init__.py")) as f:
            assert ast.get_docstring(ast.parse(f.read())), name


def test_every_import_goes_down_or_sideways():
    wrong = []
    for module, targets in IMPORTS.items():
        here = _package(module)
        if here is None:
            continue
        for target, _, _ in targets:
            there = _package(target)
            if there is None or there == here:
                continue
            if LAYERS[there] > LAYERS[here] or (here in STAGES and there in STAGES):
                wrong.append(f"{module} imports {target}")
            elif here == "report" and there not in REPORT_READS:
                wrong.append(f"{module} imports {target} (the report reads records only)")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle():
    cycles = import_cycles(IMPORTS)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _write_package(tmp_path, files):
    for name, text in files.items():
        path = tmp_path / "fake" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path / "fake")


@pytest.mark.parametrize(
    "files, cycles",
    [
        # A module-level circle of three modules inside one subpackage.
        (
            {
                "__init__.py": "",
                "sub/__init__.py": "",
                "sub/a.py": "from .b import x\n",
                "sub/b.py": "from .c import y\nx = 1\n",
                "sub/c.py": "import fake.sub.a\ny = 2\n",
            },
            ["fake.sub.a -> fake.sub.b -> fake.sub.c -> fake.sub.a"],
        ),
        # A module importing a name of its package, whose __init__ imports that module.
        (
            {"__init__.py": "from .a import f\nx = 1\n", "a.py": "from . import x\n\ndef f():\n    return x\n"},
            ["fake -> fake.a -> fake"],
        ),
        # What data.digits and data.embedded did: one imported the other, which imported it back in a function.
        (
            {
                "__init__.py": "from . import digits\nfrom .embedded import names\n",
                "digits.py": "from .embedded import write\n",
                "embedded.py": (
                    "def write():\n    pass\n\n\ndef names():\n    from . import digits\n    return digits\n"
                ),
            },
            ["fake.digits -> fake.embedded -> fake.digits (fake.embedded imports fake.digits in a function)"],
        ),
        # No circle: a package exposing its modules, which import each other one way, and the standard library.
        (
            {
                "__init__.py": "from .a import x\nfrom . import b\n",
                "a.py": "import os\nfrom . import b\nx = 1\n",
                "b.py": "import fake.c\n\ndef g():\n    from .c import y\n    return y\n",
                "c.py": "y = 1\n",
            },
            [],
        ),
    ],
)
def test_the_cycle_check_itself(tmp_path, files, cycles):
    assert import_cycles(read_imports(_write_package(tmp_path, files))) == cycles


def test_no_private_name_crosses_a_module():
    wrong = [
        f"{module} imports {target}.{name}"
        for module, targets in IMPORTS.items()
        for target, name, _ in targets
        if name and name.startswith("_") and not name.startswith("__")
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    "module, target, ok",
    [
        ("condinit_det.engine.stage", "condinit_det.stage.interface", True),
        ("condinit_det.engine.stage", "condinit_det.launch.run", False),
        ("condinit_det.engine.train", "condinit_det.launch.plan", False),
        ("condinit_det.pretrain.trainer", "condinit_det.engine.config", False),
        ("condinit_det.records.results", "condinit_det.engine.hooks", False),
        ("condinit_det.report.compare", "condinit_det.modeling.arm", False),
        ("condinit_det.launch.run", "condinit_det.tracking.writers", True),
        ("condinit_det.pretrain.trainer", "condinit_det.tracking.writers", True),
        ("condinit_det.tracking.writers", "condinit_det.launch.run", False),
        ("condinit_det.tracking.writers", "condinit_det.report.compare", False),
    ],
)
def test_the_rules_themselves(module, target, ok, monkeypatch):
    monkeypatch.setitem(IMPORTS, module, [(target, None, False)])
    if ok:
        test_every_import_goes_down_or_sideways()
    else:
        with pytest.raises(AssertionError, match=f"{module} imports {target}"):
            test_every_import_goes_down_or_sideways()


def test_a_worker_whose_tests_come_without_their_group_stops_the_run():
    """Under --dist loadgroup a worker's test ids carry their group (``…@group``); ids without it (pytest 9.2 with
    pytest-xdist 3.8) stop the run with a usage error, rather than making every shared run on both workers."""
    from types import SimpleNamespace

    import conftest

    def node(dist):
        return SimpleNamespace(config=SimpleNamespace(getvalue=lambda name: dist))

    grouped = ["tests/a.py::test[x]@tests/a.py", "tests/b.py::test@slurm"]
    conftest.pytest_xdist_node_collection_finished(node("loadgroup"), grouped)
    with pytest.raises(pytest.exit.Exception, match=r"did not put tests/a.py::test\[x\] \(and 0 more\) in a group"):
        conftest.pytest_xdist_node_collection_finished(node("loadgroup"), ["tests/a.py::test[x]", grouped[1]])
    conftest.pytest_xdist_node_collection_finished(node("load"), ["tests/a.py::test[x]"])  # no groups asked for


def test_the_commit_hooks_run_the_ruff_the_lint_runs():
    """The formatter's layout differs between ruff releases: the pre-commit hooks and ``make lint`` (the test extra's
    ruff) must be one version, or a commit formatted by the hook fails the lint."""
    import re

    with open(os.path.join(ROOT, "setup.py")) as f:
        pinned = re.search(r'"ruff==([0-9.]+)"', f.read())
    with open(os.path.join(ROOT, ".pre-commit-config.yaml")) as f:
        hooks = f.read()
    assert pinned, "setup.py's test extra pins ruff with =="
    assert re.search(
        r"repo: https://github.com/astral-sh/ruff-pre-commit\n\s+rev: v" + re.escape(pinned[1]) + r"\b", hooks
    )
    assert "id: ruff\n" in hooks and "id: ruff-format" in hooks
