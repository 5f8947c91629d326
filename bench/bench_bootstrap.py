"""
Benchmark: the report's paired image bootstrap, one COCO re-evaluation per resample (before) vs one
matching per model and task, then an accumulation per resample (now).

    python bench/bench_bootstrap.py                          # 5000 images, B = 1000, 1 re-evaluated resample
    python bench/bench_bootstrap.py --images 500 --old-resamples 3
    python bench/bench_bootstrap.py --quick                  # tiny smoke run (tests)

The synthetic COCO data of ``bench/bench_eval.py``, two "arms" (the same detector at two seeds, the second with
recall 0.75), bbox and segm, the report's draws (``rng.integers(0, n, size=n)`` per resample). Before: each
resample is a new COCO dataset evaluated from scratch (``bench/coco_reevaluation.py``), timed on a few resamples;
now: ``match_images`` once per arm and task, then ``resampled_ap`` for all B resamples. The re-evaluated AP, AP50
and AP75 must equal the accumulated ones within 1e-9 (else exit status 1).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

from condinit_det.evaluation.bootstrap import AP_METRICS, match_images, resampled_ap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, however invoked
from coco_reevaluation import reevaluated_ap  # noqa: E402
from common import format_machine_info, format_table, load_average, machine_info, speedup  # noqa: E402
from synthetic_coco import make_synthetic_coco, synthetic_results  # noqa: E402

TOLERANCE = 1e-9
TASKS = ("bbox", "segm")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--resamples", type=int, default=1000, help="B of the new method")
    parser.add_argument("--old-resamples", type=int, default=1, help="resamples re-evaluated the old way (timed)")
    parser.add_argument("--categories", type=int, default=80)
    parser.add_argument("--seed", type=int, default=0, help="data seed; the bootstrap generator's seed")
    parser.add_argument("--quick", action="store_true", help="30 images, 10 categories, B = 50, 2 old resamples")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.categories, args.resamples, args.old_resamples = 30, 10, 50, 2
    if min(args.images, args.categories, args.resamples, args.old_resamples) < 1:
        parser.error("--images, --categories, --resamples and --old-resamples must be >= 1")
    if args.old_resamples > args.resamples:
        parser.error("--old-resamples must be <= --resamples (they are the first of the B draws)")

    print(format_machine_info(machine_info(("numpy", "pycocotools", "faster_coco_eval"))))
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}", flush=True)
    t0 = time.perf_counter()
    gt = make_synthetic_coco(num_images=args.images, num_categories=args.categories, seed=args.seed)
    arms = []  # every detection of an arm, image after image
    for offset, recall in ((1, 0.85), (2, 0.75)):
        per_image = synthetic_results(gt, seed=args.seed + offset, recall=recall)
        arms.append([result for results in per_image.values() for result in results])
    n = len(gt["images"])
    print(
        f"{n} images, {len(gt['annotations'])} GT objects, {len(arms[0])} + {len(arms[1])} detections, "
        f"generated in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    draws = np.random.default_rng(args.seed).integers(0, n, size=(args.resamples, n))

    match_s = accumulate_s = 0.0
    new = {}
    for task in TASKS:
        for a, preds in enumerate(arms):
            t0 = time.perf_counter()
            matches = match_images(gt, preds, task)
            t1 = time.perf_counter()
            new[task, a] = resampled_ap(matches, draws)
            t2 = time.perf_counter()
            match_s += t1 - t0
            accumulate_s += t2 - t1
            tied = int((matches.group >= 0).sum())
            print(
                f"  now {task} arm {a}: matching {t1 - t0:.1f} s, {args.resamples} accumulations "
                f"{t2 - t1:.1f} s ({tied} detections share a score)",
                flush=True,
            )
    new_total = match_s + accumulate_s

    old_s, worst = [], 0.0
    for b in range(args.old_resamples):
        t0 = time.perf_counter()
        for task in TASKS:
            reference = reevaluated_ap(gt, arms, draws[b], task)
            for a, ref in enumerate(reference):
                for k in AP_METRICS:
                    r, o = ref[k], new[task, a][k][b]
                    worst = max(worst, 0.0 if math.isnan(r) and math.isnan(o) else abs(r - o))
        old_s.append(time.perf_counter() - t0)
        print(f"  before: resample {b} re-evaluated (2 arms x 2 tasks) in {old_s[-1]:.1f} s", flush=True)
    old_per = float(np.mean(old_s))
    new_per = new_total / args.resamples

    rows = [
        [
            "before: re-evaluate each resample",
            f"{args.old_resamples} timed",
            f"{old_per:.3f}",
            f"{old_per * args.resamples / 60:.1f} (extrapolated)",
            "1.00x",
        ],
        [
            "now: match once, accumulate each resample",
            f"{args.resamples}",
            f"{new_per:.4f}",
            f"{new_total / 60:.2f} (matching {match_s:.1f} s + accumulation {accumulate_s:.1f} s)",
            f"{speedup(old_per, new_per):.0f}x",
        ],
    ]
    print()
    print(
        f"{n} images, one arm pair, bbox + segm, B = {args.resamples}, generator seed {args.seed}; AP / AP50 / "
        f"AP75 of the {args.old_resamples} re-evaluated resamples vs accumulated: max |diff| {worst:.2g}"
    )
    print(format_table(["method", "resamples", "s per resample", f"min for B = {args.resamples}", "speed-up"], rows))
    print(f"load avg after run (1/5/15 min): {load_average()}")
    if not worst <= TOLERANCE:
        print(f"FAIL: accumulated AP differs from re-evaluation by {worst:.3g} > {TOLERANCE:g}", file=sys.stderr)
        return 1
    print(f"OK: accumulated AP equals re-evaluated AP within {TOLERANCE:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
