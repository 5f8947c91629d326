#!/usr/bin/env python
"""
The GPU check (``make gpu-check``): the tests marked ``gpu`` and the init-cost bench on the device,
one verdict line per check. Needs a CUDA device; about 10 minutes on one GPU.

    $ tools/gpu_check.py                                  # tests/test_gpu.py, then ViTDet-B/L/H
    $ tools/gpu_check.py --models vitdet_b --no-tests     # the bench only, one model

Verdicts: ``PASS`` / ``FAIL`` / ``SKIP`` (with pytest's reason) per test; per bench model ``PASS``
when the conditioned arm costs at most 10% of the build (build on the CPU + move to the GPU) and
mimetic at most 1x, else ``SLOW`` (the times are printed either way). Exit status 1 when a test
failed, 2 when there is no CUDA device.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests", "test_gpu.py")
CONDITIONED_TARGET, MIMETIC_TARGET = 0.10, 1.0


def run_tests(timeout: int):
    """pytest on the gpu tests; yields (verdict, test id, seconds, detail)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "junit.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", TESTS,
               f"--junitxml={report}"]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            yield "FAIL", "tests/test_gpu.py", float(timeout), f"timed out after {timeout} s"
            return
        if not os.path.isfile(report):
            last = (proc.stdout + proc.stderr).strip().splitlines()[-1:]
            yield "FAIL", "tests/test_gpu.py", 0.0, "".join(last)
            return
        for case in ET.parse(report).getroot().iter("testcase"):
            name = case.get("name")
            seconds = float(case.get("time", 0.0))
            failed = case.find("failure")
            if failed is None:
                failed = case.find("error")
            skipped = case.find("skipped")
            if failed is not None:
                yield "FAIL", name, seconds, (failed.get("message") or "").splitlines()[0][:160]
            elif skipped is not None:
                yield "SKIP", name, seconds, (skipped.get("message") or "")[:160]
            else:
                yield "PASS", name, seconds, ""


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
        detail = (f"build {build:.2f} s; conditioned {cost['conditioned']:.3f} s ({100 * ratio_c:.1f}%, target "
                  f"<= {100 * CONDITIONED_TARGET:.0f}%); mimetic {cost['mimetic']:.3f} s ({ratio_m:.2f}x, target "
                  f"<= {MIMETIC_TARGET:g}x)")
        yield "PASS" if ok else "SLOW", f"bench {name}", time.perf_counter() - start, detail


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="vitdet_b,vitdet_l,vitdet_h", help="bench models (bench_init_cost.py)")
    parser.add_argument("--no-tests", action="store_true", help="skip the gpu tests")
    parser.add_argument("--no-bench", action="store_true", help="skip the init-cost bench")
    parser.add_argument("--test-timeout", type=int, default=420, help="seconds for all gpu tests together")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu-check: error: no CUDA device is available; run it on a machine with a GPU", file=sys.stderr)
        return 2
    print(f"gpu-check on {torch.cuda.get_device_name()} ({torch.cuda.device_count()} device(s)), torch "
          f"{torch.__version__}", flush=True)
    counts = {}
    checks = []
    if not args.no_tests:
        checks.append(run_tests(args.test_timeout))
    if not args.no_bench:
        checks.append(run_bench([m for m in args.models.split(",") if m]))
    for check in checks:
        for verdict, name, seconds, detail in check:
            counts[verdict] = counts.get(verdict, 0) + 1
            print(f"{verdict:4s}  {name}  ({seconds:.1f} s){'  ' + str(detail) if detail else ''}", flush=True)
    print("gpu-check: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())), flush=True)
    return 1 if counts.get("FAIL") else 0


if __name__ == "__main__":
    sys.exit(main())
