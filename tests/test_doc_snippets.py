"""The Python snippets of README.md and docs/*.md run as written, on the embedded demo data.

Every ```python fence runs, in the order the pages list them, each in a namespace of its own, in one process (the
imports are paid once) inside a temporary folder; excerpts of a config file, or code around a class the reader writes
(``MyStage``), are fenced ```python fragment and only read. Then README's "use it in your own config" is followed
literally: its snippet, with a demo config's data, optimizer, schedule and train nodes, is planned by
``condinit-train --dry-run``, with and without its ``condinit`` line.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\S*)([^\n]*)\n(.*?)^```\s*$", re.M | re.S)

RUNNER = r"""
import sys, traceback
snippets = eval(open(sys.argv[1]).read())
failed = []
for where, code in snippets:
    try:
        exec(compile(code, where, "exec"), {"__name__": "__snippet__"})
    except BaseException:
        failed.append(where + "\n" + traceback.format_exc(limit=3))
print("\n".join(failed))
sys.exit(1 if failed else 0)
"""


def python_snippets():
    """(page:line, code) of every ```python fence that is not marked ``fragment``."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            if m.group(1) == "python" and "fragment" not in m.group(2):
                line = text[: m.start()].count("\n") + 1
                found.append((f"{page.relative_to(REPO)}:{line}", m.group(3)))
    return found


def _env(tmp_path):
    return dict(
        os.environ,
        CONDINIT_DATA=str(tmp_path / "data"),
        PYTHONPATH=str(REPO),
        PYTHONWARNINGS="ignore",
        OMP_NUM_THREADS="1",
    )


def test_every_page_has_its_snippets_found():
    pages = {where.split(":")[0] for where, _ in python_snippets()}
    assert {"README.md", "docs/arms.md", "docs/configs.md"} <= pages, pages


@pytest.mark.slow
def test_the_python_snippets_run_as_written(tmp_path):
    listed = tmp_path / "snippets.txt"
    listed.write_text(repr(python_snippets()))
    work = tmp_path / "work"
    work.mkdir()
    (work / "configs").symlink_to(REPO / "configs", target_is_directory=True)  # paths as the docs write them
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(listed)],
        cwd=work,
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]


README_TAIL = """
# dataloader, optimizer, lr_multiplier and train of the tiny demo config, as a user's own config would define them
from condinit_det import model_zoo as _zoo  # noqa: E402

_demo = _zoo.get_config("demo/mask_rcnn_vit_tiny.py")
dataloader, optimizer, lr_multiplier, train = _demo.dataloader, _demo.optimizer, _demo.lr_multiplier, _demo.train
"""


@pytest.mark.slow
@pytest.mark.parametrize("with_node", [True, False], ids=["as written", "without the condinit line"])
def test_own_config_as_the_readme_writes_it(tmp_path, with_node):
    snippet = next(code for where, code in python_snippets() if where.startswith("README.md") and "armed(" in code)
    if not with_node:
        snippet = "\n".join(line for line in snippet.splitlines() if not line.startswith("condinit = "))
    config = tmp_path / "my_config.py"
    config.write_text(snippet + README_TAIL)
    argv = [
        sys.executable,
        str(REPO / "tools" / "train_net.py"),
        "--config-file",
        str(config),
        "--arm",
        "conditioned",
        "--dry-run",
        f"train.output_dir={tmp_path / 'out'}",
    ]
    done = subprocess.run(argv, cwd=REPO, env=_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"conditioned/seed0 +train", done.stdout), done.stdout
    assert "1 of 1 run(s) would train; nothing was written" in done.stdout
