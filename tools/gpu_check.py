#!/usr/bin/env python
"""
The GPU check (``make gpu-check``): the tests marked ``gpu`` and the init-cost bench on the device,
one verdict line per check. Needs a CUDA device; about 10 minutes on one GPU.

    $ tools/gpu_check.py                                  # tests/test_gpu.py, then ViTDet-B/L/H
    $ tools/gpu_check.py --models vitdet_b --no-tests     # the bench only, one model
    $ tools/gpu_check.py --json out/check.json --junitxml out/tests.xml   # keep the verdicts and pytest's report

Verdicts: ``PASS`` / ``FAIL`` / ``SKIP`` (with pytest's reason) per test; per bench model ``PASS``
when the conditioned arm costs at most 10% of the build (build on the CPU + move to the GPU) and
mimetic at most 1x, else ``SLOW`` (the times are printed either way). When the tests run past
``--test-timeout``, the tests that finished keep their verdicts and one ``FAIL`` names the timeout.
Exit status 1 when a check failed, 2 when there is no CUDA device.

``--json PATH`` is rewritten after every verdict, so a check stopped from outside keeps what it
finished: ``{"device": ..., "torch": ..., "checks": [{"verdict", "name", "seconds", "detail"}, ...],
"counts": {verdict: n}, "complete": bool}``.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests", "test_gpu.py")
CONDITIONED_TARGET, MIMETIC_TARGET = 0.10, 1.0
# pytest -v: "tests/test_gpu.py::test_name[params] PASSED  [ 12%]"
VERBOSE_LINE = re.compile(r"^\S*::(?P<name>\S+) (?P<outcome>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
VERBOSE_VERDICT = {
    "PASSED": "PASS",
    "XPASS": "PASS",
    "FAILED": "FAIL",
    "ERROR": "FAIL",
    "SKIPPED": "SKIP",
    "XFAIL": "SKIP",
}


def _text(output):
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def junit_verdicts(report):
    """(verdict, test name, seconds, detail) per test case of a pytest JUnit XML report."""
    for case in ET.parse(report).getroot().iter("testcase"):
        seconds = float(case.get("time", 0.0))
        failed = case.find("failure")
        if failed is None:
            failed = case.find("error")
        skipped = case.find("skipped")
        if failed is not None:
            yield "FAIL", case.get("name"), seconds, (failed.get("message") or "").splitlines()[0][:160]
        elif skipped is not None:
            yield "SKIP", case.get("name"), seconds, (skipped.get("message") or "")[:160]
        else:
            yield "PASS", case.get("name"), seconds, ""


def verbose_verdicts(output):
    """(verdict, test name, 0.0, "") per test that pytest -v reported as finished in ``output``."""
    for line in output.splitlines():
        match = VERBOSE_LINE.match(line)
        if match:
            yield VERBOSE_VERDICT[match["outcome"]], match["name"], 0.0, "finished before the timeout"


def run_tests(timeout: int, junitxml=None):
    """pytest on the gpu tests; yields (verdict, test id, seconds, detail).

    Args:
        timeout: seconds for all the tests together.
        junitxml: where to keep pytest's JUnit XML report (default: a temporary file).
    """
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.abspath(junitxml) if junitxml else os.path.join(tmp, "junit.xml")
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-v",
            "-p",
            "no:cacheprovider",
            "-m",
            "gpu",
            TESTS,
            f"--junitxml={report}",
        ]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            # pytest writes its report at the end: the verbose lines are what finished.
            yield from verbose_verdicts(_text(e.stdout))
            yield "FAIL", "tests/test_gpu.py", float(timeout), f"timed out after {timeout} s"
            return
        if not os.path.isfile(report):
            last = (proc.stdout + proc.stderr).strip().splitlines()[-1:]
            yield "FAIL", "tests/test_gpu.py", 0.0, "".join(last)
            return
        yield from junit_verdicts(report)


def run_bench(models):
    """The init-cost bench on the GPU (one fresh process per model); yields (verdict, model, seconds, detail)."""
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import bench_init_cost

    for name in models:
        start = time.perf_counter()
        try:
            rows = bench_init_cost.measure(name, ["conditioned", "mimetic"], 1, device="cuda")
        except subprocess.CalledProcessError as e:
            last = (e.stderr or "").strip().splitlines()[-1:]
            yield "FAIL", f"bench {name}", time.perf_counter() - start, "".join(last)
            continue
        build = float(rows[0][4])
        cost = {row[3]: float(row[5]) for row in rows}
        ratio_c, ratio_m = cost["conditioned"] / build, cost["mimetic"] / build
        ok = ratio_c <= CONDITIONED_TARGET and ratio_m <= MIMETIC_TARGET
        detail = (
            f"build {build:.2f} s; conditioned {cost['conditioned']:.3f} s ({100 * ratio_c:.1f}%, target "
            f"<= {100 * CONDITIONED_TARGET:.0f}%); mimetic {cost['mimetic']:.3f} s ({ratio_m:.2f}x, target "
            f"<= {MIMETIC_TARGET:g}x)"
        )
        yield "PASS" if ok else "SLOW", f"bench {name}", time.perf_counter() - start, detail


def count_verdicts(checks):
    """{verdict: number of checks} of a list of check records."""
    counts = {}
    for check in checks:
        counts[check["verdict"]] = counts.get(check["verdict"], 0) + 1
    return counts


def write_json(path, header, checks, complete):
    """The verdicts so far as JSON, replaced atomically (a reader never sees half a file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({**header, "checks": checks, "counts": count_verdicts(checks), "complete": complete}, f, indent=1)
    os.replace(tmp, path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="vitdet_b,vitdet_l,vitdet_h", help="bench models (bench_init_cost.py)")
    parser.add_argument("--no-tests", action="store_true", help="skip the gpu tests")
    parser.add_argument("--no-bench", action="store_true", help="skip the init-cost bench")
    parser.add_argument("--test-timeout", type=int, default=420, help="seconds for all gpu tests together")
    parser.add_argument("--json", metavar="PATH", help="write the verdicts as JSON to PATH (after every verdict)")
    parser.add_argument("--junitxml", metavar="PATH", help="keep pytest's JUnit XML report of the tests at PATH")
    args = parser.parse_args(argv)
    if args.test_timeout < 1:
        parser.error(f"--test-timeout must be a positive number of seconds, got {args.test_timeout}")
    if not torch.cuda.is_available():
        print("gpu-check: error: no CUDA device is available; run it on a machine with a GPU", file=sys.stderr)
        return 2
    header = {
        "device": torch.cuda.get_device_name(),
        "device_count": torch.cuda.device_count(),
        "torch": torch.__version__,
    }
    print(f"gpu-check on {header['device']} ({header['device_count']} device(s)), torch {header['torch']}", flush=True)
    checks = []
    if args.json:
        write_json(args.json, header, checks, complete=False)
    runs = []
    if not args.no_tests:
        runs.append(run_tests(args.test_timeout, args.junitxml))
    if not args.no_bench:
        runs.append(run_bench([m for m in args.models.split(",") if m]))
    for run in runs:
        for verdict, name, seconds, detail in run:
            checks.append({"verdict": verdict, "name": name, "seconds": round(seconds, 3), "detail": detail})
            print(f"{verdict:4s}  {name}  ({seconds:.1f} s){'  ' + str(detail) if detail else ''}", flush=True)
            if args.json:
                write_json(args.json, header, checks, complete=False)
    if args.json:
        write_json(args.json, header, checks, complete=True)
    counts = count_verdicts(checks)
    print("gpu-check: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())), flush=True)
    return 1 if counts.get("FAIL") else 0


if __name__ == "__main__":
    sys.exit(main())
