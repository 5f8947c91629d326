"""The package's layers, checked on its import statements (docs/development.md: the layout).

Bottom to top: ``utils`` (the ground) -> ``init``, ``records``, ``stage`` -> ``modeling``, ``evaluation``,
``analysis``, ``data``, ``model_zoo``, ``tracking`` -> the stages ``engine`` and ``pretrain`` -> ``launch`` and
``report`` -> ``commands``. A module imports its own layer or lower ones (the stage interface sits below the stages
that implement it); the stages import nothing from the launcher and never each other; the report reads records (no
training code); no import cycle; no ``_private`` name imported from another module.
"""
import ast
import os
from collections import defaultdict

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "condinit_det")
LAYERS = {
    "utils": 0,
    "init": 1, "records": 1, "stage": 1,
    "modeling": 2, "evaluation": 2, "analysis": 2, "data": 2, "model_zoo": 2, "tracking": 2,
    "engine": 3, "pretrain": 3,
    "launch": 4, "report": 4,
    "commands": 5,
}
STAGES = ("engine", "pretrain")
REPORT_READS = ("utils", "init", "records", "stage", "evaluation", "report")


def _module_name(path):
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def _imports():
    """module -> [(imported module, imported name or None)] for every import of the package's own modules."""
    found = defaultdict(list)
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = [d for d in dirs if d not in ("__pycache__", "configs")]
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            module = _module_name(path)
            parts = module.split(".") if name == "__init__.py" else module.split(".")[:-1]
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom):
                    base = parts[: len(parts) - node.level + 1] if node.level else []
                    target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                    if target and target.split(".")[0] == "condinit_det":
                        found[module] += [(target, a.name) for a in node.names]
                elif isinstance(node, ast.Import):
                    found[module] += [(a.name, None) for a in node.names if a.name.split(".")[0] == "condinit_det"]
    return found


IMPORTS = _imports()


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
        for target, _ in targets:
            there = _package(target)
            if there is None or there == here:
                continue
            if LAYERS[there] > LAYERS[here] or (here in STAGES and there in STAGES):
                wrong.append(f"{module} imports {target}")
            elif here == "report" and there not in REPORT_READS:
                wrong.append(f"{module} imports {target} (the report reads records only)")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycle():
    graph = {m: {t for t, _ in ts} & set(IMPORTS) for m, ts in IMPORTS.items()}
    # A package's __init__ importing its own modules is how a package exposes them; leave those edges out.
    graph = {m: {t for t in ts if not m == t.rsplit(".", 1)[0] and t != m} for m, ts in graph.items()}
    state, cycles = {}, []

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


def test_no_private_name_crosses_a_module():
    wrong = [f"{module} imports {target}.{name}" for module, targets in IMPORTS.items() for target, name in targets
             if name and name.startswith("_") and not name.startswith("__")]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("module, target, ok", [
    ("condinit_det.engine.stage", "condinit_det.stage.interface", True),
    ("condinit_det.engine.stage", "condinit_det.launch.experiment", False),
    ("condinit_det.engine.train", "condinit_det.launch.experiment", False),
    ("condinit_det.pretrain.trainer", "condinit_det.engine.config", False),
    ("condinit_det.records.results", "condinit_det.engine.hooks", False),
    ("condinit_det.report.paired", "condinit_det.modeling.arm", False),
    ("condinit_det.launch.experiment", "condinit_det.tracking.runs", True),
    ("condinit_det.pretrain.trainer", "condinit_det.tracking.events", True),
    ("condinit_det.tracking.runs", "condinit_det.launch.experiment", False),
    ("condinit_det.tracking.runs", "condinit_det.report.compare", False),
])
def test_the_rules_themselves(module, target, ok, monkeypatch):
    monkeypatch.setitem(IMPORTS, module, [(target, None)])
    if ok:
        test_every_import_goes_down_or_sideways()
    else:
        with pytest.raises(AssertionError, match=f"{module} imports {target}"):
            test_every_import_goes_down_or_sideways()
