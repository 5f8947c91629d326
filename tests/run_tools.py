#!/usr/bin/env python
"""
Run several ``tools/*.py`` command lines one after another in one process, as ``__main__``.

    python tests/run_tools.py PLAN.json STATUS.json

PLAN is a list of steps ``{"name", "tool", "argv", "cwd", "drop_checkpoints", "keep_final"}``: ``tool`` is
the path of a script under ``tools/``, run with ``sys.argv = [tool, *argv]`` in ``cwd``, exactly as a
user's command line would run it, but with torch, detectron2 and timm imported once for all steps
(each import costs seconds on a small CPU machine). ``drop_checkpoints`` names a folder (relative
to ``cwd``) whose ``*.pth`` and ``*.safetensors`` files are deleted after the step, once their names
are recorded; with ``keep_final``, the ``model_final.*`` files stay (a later step reads them).

STATUS is rewritten after every step: ``{name: {"ok", "exit", "error", "seconds", "checkpoints"}}``.
Every step runs even when an earlier one failed; a line ``=== step <name>`` on stdout and stderr
starts the output of each step. Exit status: 0 when every step succeeded, else 1.
"""

import gc
import glob
import json
import os
import runpy
import sys
import time
import traceback


def run_step(step):
    os.chdir(step["cwd"])
    sys.argv = [step["tool"], *step["argv"]]
    record = {"ok": False, "exit": None, "error": None}
    try:
        runpy.run_path(step["tool"], run_name="__main__")
        record["ok"] = True
    except SystemExit as e:  # the tools end bad input with sys.exit(2)
        record["exit"] = e.code
        record["ok"] = e.code in (None, 0)
    except BaseException:  # noqa: B902  (a failing step must not stop the others)
        record["error"] = traceback.format_exc()[-6000:]
    return record


def main(plan_file, status_file):
    with open(plan_file) as f:
        plan = json.load(f)
    status = {}
    for step in plan:
        for stream in (sys.stdout, sys.stderr):
            print(f"=== step {step['name']}", file=stream, flush=True)
        start = time.perf_counter()
        record = run_step(step)
        record["seconds"] = round(time.perf_counter() - start, 1)
        drop = step.get("drop_checkpoints")
        if drop:
            files = sorted(
                path
                for pattern in ("*.pth", "*.safetensors")
                for path in glob.glob(os.path.join(step["cwd"], drop, "**", pattern), recursive=True)
            )
            record["checkpoints"] = [os.path.relpath(p, step["cwd"]) for p in files]
            for path in files:  # large models: keep the disk use of a whole plan small
                if not (step.get("keep_final") and os.path.basename(path).startswith("model_final.")):
                    os.remove(path)
        status[step["name"]] = record
        gc.collect()
        with open(status_file + ".tmp", "w") as f:
            json.dump(status, f, indent=1)
        os.replace(status_file + ".tmp", status_file)
        print(f"=== step {step['name']} done: ok={record['ok']} in {record['seconds']} s", flush=True)
    return 0 if all(r["ok"] for r in status.values()) else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: run_tools.py PLAN.json STATUS.json")
    sys.exit(main(os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])))
