"""How long the commands take to answer: ``--help`` of every console script, and ``condinit-status`` /
``condinit-compare`` on an experiment, each as a ratio to ``python -c pass`` timed in the same run.

    python bench/bench_cli.py                                  # --help of every command; status and compare of
                                                               # output/demo when it exists
    python bench/bench_cli.py --experiment output/demo_paper/finetune
    python bench/bench_cli.py --quick                          # --help only, one repeat

Each command runs in a fresh process (``python -m condinit_det.commands.<name>``), ``--repeats`` times (median).
compare is timed twice: into a new folder (it resamples the images and draws the figures) and again into the same
folder with nothing changed (it reuses both). Targets: ``--help`` <= 1 s, status and compare <= 2 s on the demo
experiment.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import format_machine_info, format_table, machine_info, median  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = ("train", "pretrain", "compare", "conditioning", "status", "protocol")


def _seconds(argv, repeats, fresh_output=None):
    """Median wall time of ``argv``; with ``fresh_output``, each repeat writes into a new folder under it."""
    times = []
    for k in range(repeats):
        output = [] if fresh_output is None else ["--output", os.path.join(fresh_output, str(k))]
        start = time.perf_counter()
        done = subprocess.run([sys.executable, *argv, *output], cwd=ROOT, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv + output)} exited {done.returncode}: {done.stderr[-2000:]}")
    return median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiment", default="output/demo", help="experiment for status and compare")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="--help only, one repeat (the test suite's run)")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    print(format_machine_info(machine_info()))
    base = _seconds(["-c", "pass"], repeats)
    rows = []
    for name in COMMANDS:
        seconds = _seconds(["-m", f"condinit_det.commands.{name}", "--help"], repeats)
        rows.append([f"condinit-{name} --help", f"{seconds:.2f}", f"{seconds / base:.1f}", "1.0"])
    experiment = os.path.join(ROOT, args.experiment)
    if not args.quick and os.path.isdir(experiment):
        with tempfile.TemporaryDirectory() as out:
            command = ["-m", "condinit_det.commands.compare", experiment]
            for label, seconds in (
                (
                    f"condinit-status {args.experiment}",
                    _seconds(["-m", "condinit_det.commands.status", experiment], repeats),
                ),
                (f"condinit-compare {args.experiment} (new folder)", _seconds(command, repeats, fresh_output=out)),
                (
                    f"condinit-compare {args.experiment} (again)",
                    _seconds([*command, "--output", os.path.join(out, "0")], repeats),
                ),
            ):
                rows.append([label, f"{seconds:.2f}", f"{seconds / base:.1f}", "2.0"])
    elif not args.quick:
        print(f"(no experiment at {args.experiment}: status and compare not timed; `make demo` writes one)")
    print(f"python -c pass: {base:.3f} s (median of {repeats})")
    print(format_table(["command", "seconds", "x python -c pass", "target s"], rows))
    slow = [row[0] for row in rows if float(row[1]) > float(row[3])]
    print("OK: every command within its target" if not slow else f"SLOW: {', '.join(slow)}")


if __name__ == "__main__":
    main()
