"""
Benchmark: FastCOCOEvaluator (faster-coco-eval) vs detectron2's COCOEvaluator (pycocotools).

    python bench/bench_eval.py                    # 500 and 5000 images
    python bench/bench_eval.py --images 500 --repeats 3
    python bench/bench_eval.py --quick            # tiny smoke run (tests)

Both evaluators get the same synthetic predictions (``synthetic_coco``: ~7 objects per image, 80 categories,
~25 false positives per image, at most 100 detections) and are timed on ``evaluate()``, bbox and segm apart.
``process()`` is the same inherited code in both, so each evaluator is filled with the records ``process()``
would store; each repeat builds a fresh evaluator (its constructor timed apart), so no cache carries over.
Exits with status 1 if any metric differs by more than 1e-9 between the two evaluators.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import math
import os
import sys
import tempfile
import time

import torch
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import register_coco_instances
from detectron2.evaluation import COCOEvaluator

from condinit_det.evaluation import FastCOCOEvaluator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/common.py, however invoked
from common import format_machine_info, format_table, load_average, machine_info, median, speedup  # noqa: E402
from synthetic_coco import make_synthetic_coco, synthetic_results  # noqa: E402

TOLERANCE = 1e-9


def max_abs_diff(ours: dict, ref: dict) -> float:
    """Largest |ours - ref| over every metric of every task; inf if keys or NaN positions differ."""
    if ours.keys() != ref.keys():
        return math.inf
    worst = 0.0
    for task in ref:
        if ours[task].keys() != ref[task].keys():
            return math.inf
        for key, r in ref[task].items():
            o = ours[task][key]
            if math.isnan(r) or math.isnan(o):
                if not (math.isnan(r) and math.isnan(o)):
                    return math.inf
                continue
            worst = max(worst, abs(o - r))
    return worst


def bench_size(num_images, args):
    """Times both evaluators on one synthetic dataset; returns table rows and the worst AP diff."""
    t0 = time.perf_counter()
    gt = make_synthetic_coco(num_images=num_images, num_categories=args.categories, seed=args.seed)
    records = [
        {"image_id": image_id, "instances": results}
        for image_id, results in synthetic_results(gt, seed=args.seed + 1).items()
    ]
    num_dets = sum(len(r["instances"]) for r in records)
    print(
        f"[{num_images} images] {len(gt['annotations'])} GT objects, {num_dets} detections "
        f"({num_dets / num_images:.1f}/image), generated in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )

    rows, worst = [], 0.0
    totals = {"ref": 0.0, "ours": 0.0}
    with tempfile.TemporaryDirectory(prefix="bench_eval_") as tmp:
        json_file = os.path.join(tmp, "gt.json")
        with open(json_file, "w") as f:
            json.dump(gt, f)
        name = f"bench_eval_{num_images}_{os.getpid()}"
        register_coco_instances(name, {}, json_file, tmp)
        DatasetCatalog.get(name)  # fills the category id mapping in the metadata
        factories = {
            "ref": lambda task: COCOEvaluator(name, tasks=(task,), distributed=False, use_fast_impl=False),
            "ours": lambda task: FastCOCOEvaluator(name, tasks=(task,), distributed=False),
        }
        try:
            for task in ("bbox", "segm"):
                results, eval_s, init_s = {}, {}, {}
                for impl, factory in factories.items():
                    times = []
                    for _ in range(args.repeats):  # a fresh evaluator each time: no cache carries over
                        start = time.perf_counter()
                        evaluator = factory(task)
                        init_s[impl] = time.perf_counter() - start
                        evaluator.reset()
                        # What process() would have stored (see predictions_to_coco_results).
                        evaluator._predictions = copy.deepcopy(records)
                        start = time.perf_counter()
                        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints
                            results[impl] = evaluator.evaluate()
                        times.append(time.perf_counter() - start)
                    eval_s[impl] = median(times)
                    totals[impl] += eval_s[impl]
                diff = max_abs_diff(results["ours"], results["ref"])
                worst = max(worst, diff)
                rows.append(
                    [
                        num_images,
                        task,
                        num_dets,
                        eval_s["ref"],
                        eval_s["ours"],
                        f"{speedup(eval_s['ref'], eval_s['ours']):.2f}x",
                        f"{diff:.1e}",
                        f"{init_s['ref']:.2f} / {init_s['ours']:.2f}",
                        f"{results['ours'][task]['AP']:.2f}",
                    ]
                )
                print(
                    f"  {task}: pycocotools {eval_s['ref']:.2f} s, faster-coco-eval {eval_s['ours']:.2f} s, "
                    f"max |dAP| {diff:.1e}",
                    flush=True,
                )
        finally:
            DatasetCatalog.remove(name)
            MetadataCatalog.remove(name)
    rows.append(
        [
            num_images,
            "bbox+segm",
            num_dets,
            totals["ref"],
            totals["ours"],
            f"{speedup(totals['ref'], totals['ours']):.2f}x",
            f"{worst:.1e}",
            "",
            "",
        ]
    )
    return rows, worst


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, nargs="+", default=[500, 5000], help="dataset sizes to time")
    parser.add_argument("--repeats", type=int, default=1, help="timed evaluate() calls per cell (median)")
    parser.add_argument("--categories", type=int, default=80)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (faster-coco-eval uses its own pool)")
    parser.add_argument("--quick", action="store_true", help="one tiny dataset (20 images, 10 categories)")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.repeats, args.categories = [20], 1, 10
    if min(args.images) < 1 or args.repeats < 1 or args.categories < 1:
        parser.error("--images, --repeats and --categories must be >= 1")
    torch.set_num_threads(args.threads)

    print(format_machine_info(machine_info(("numpy", "torch", "detectron2", "pycocotools", "faster_coco_eval"))))
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}", flush=True)
    rows, worst = [], 0.0
    for n in args.images:
        size_rows, size_worst = bench_size(n, args)
        rows += size_rows
        worst = max(worst, size_worst)
    print()
    print(
        format_table(
            [
                "images",
                "task",
                "detections",
                "pycocotools s",
                "faster-coco-eval s",
                "speed-up",
                "max |dAP|",
                "init s (ref / ours)",
                "AP",
            ],
            rows,
        )
    )
    print(f"load avg after run (1/5/15 min): {load_average()}")
    if worst > TOLERANCE:
        print(f"FAIL: metrics differ by {worst:.3g} > {TOLERANCE:g}", file=sys.stderr)
        return 1
    print(f"OK: all metrics identical within {TOLERANCE:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
