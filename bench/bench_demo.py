"""Wall time and final AP of the demo: the three arms trained one after the other by train_net.

    python bench/bench_demo.py                                    # the ViTDet demo, full schedule
    python bench/bench_demo.py --config-file configs/demo/mask_rcnn_swin_tiny.py
    python bench/bench_demo.py --output output/bench_demo --opts train.max_iter=200
    python bench/bench_demo.py --quick                            # 2 iterations per arm (tests)

Runs and times ``tools/train_net.py --config-file CFG --arm all train.output_dir=DIR [overrides]``, then reads
each arm's run directory: wall s (first to last timestamp of its ``log.txt``: setup, training, evaluations; the
rest of the total is start-up and the report), train s/iter (detectron2's "Overall training speed", else the
last ``time`` of ``metrics.json``), inference s (its "Total inference time" summed over evaluations), final box
and mask AP (``condinit_det.report.compare_arms``). ``--quick``: 2 iterations, one evaluation on 8 test images
(at most 20 detections each), batch 2, where the config has those keys: a pipeline check, not numbers. The
output directory is temporary unless ``--output`` names one. Exit status 1 if train_net fails or an arm lacks
its final evaluation.
"""

import argparse
import datetime
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/common.py, however invoked
from common import format_machine_info, format_table, machine_info, median  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = "configs/demo/mask_rcnn_vit_tiny.py"
ARMS = ("default", "mimetic", "conditioned")
QUICK_ITERS = 2
QUICK_TEST_IMAGES = 8
QUICK_TOPK = 20
QUICK_BATCH = 2

_STAMP = re.compile(r"^\[(\d\d)/(\d\d) (\d\d):(\d\d):(\d\d)\]")
_SPEED = re.compile(r"Overall training speed: \d+ iterations in \S+ \(([0-9.]+) s / it\)")
_INFERENCE = re.compile(r"Total inference time: (\d+):(\d\d):(\d\d(?:\.\d+)?)")


def resolve_config(path):
    for candidate in (path, os.path.join(ROOT, path)):
        if os.path.isfile(candidate):
            return os.path.abspath(candidate)
    raise SystemExit(
        f"bench_demo: config file {path} does not exist (relative paths may start at "
        f"the current directory or at {ROOT})."
    )


def _has(cfg, key):
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key, default=None) is not None


def _target_name(node):
    target = node.get("_target_") if node is not None else None
    return target if isinstance(target, str) else getattr(target, "__qualname__", "")


def quick_overrides(cfg):
    """Overrides that shrink the config's schedule and evaluation, for the keys it has."""
    opts = [f"train.max_iter={QUICK_ITERS}", f"train.eval_period={QUICK_ITERS}", "train.log_period=1"]
    if _has(cfg, "lr_multiplier.warmup_length"):
        # A fraction of max_iter; the full schedule's warmup would exceed 2 iterations.
        opts.append("lr_multiplier.warmup_length=0.5")
    if _has(cfg, "dataloader.train.total_batch_size"):
        opts.append(f"dataloader.train.total_batch_size={QUICK_BATCH}")
    test = cfg.get("dataloader", {}).get("test")
    if test is not None and _target_name(test).endswith("build_detection_test_loader") and test.get("sampler") is None:
        # The first images of the test set only; the evaluator still scores against all of them.
        opts.append(
            f"+dataloader.test.sampler={{_target_:detectron2.data.samplers.InferenceSampler,size:{QUICK_TEST_IMAGES}}}"
        )
    if _has(cfg, "model.roi_heads.box_predictor"):
        # An untrained Mask R-CNN keeps 100 low-score detections per image, whose mask pasting
        # dominates inference on the CPU.
        opts.append(f"model.roi_heads.box_predictor.test_topk_per_image={QUICK_TOPK}")
    if _has(cfg, "condinit_analysis.period"):
        opts.append("condinit_analysis.period=0")  # the conditioning measurement has its own bench
    return opts


def load_checked(config_file, opts):
    """Load the config and apply ``opts`` here first, so a bad override fails before training."""
    from detectron2.config import LazyConfig

    if not config_file.endswith(".py"):
        raise SystemExit(f"bench_demo: {config_file} is not a lazy (.py) config; only those are accepted.")
    cfg = LazyConfig.load(config_file)
    try:
        return LazyConfig.apply_overrides(cfg, list(opts))
    except Exception as e:  # hydra / omegaconf raise several types for a bad key or value
        raise SystemExit(f"bench_demo: cannot apply overrides {opts}: {e}") from None


def _log_span_s(path):
    """Seconds between the first and the last timestamped line of a detectron2 log.txt."""
    first = last = None
    year = datetime.date.today().year
    with open(path, errors="replace") as f:
        for line in f:
            m = _STAMP.match(line)
            if m:
                mo, d, h, mi, s = map(int, m.groups())
                t = datetime.datetime(year, mo, d, h, mi, s)
                first = first or t
                last = t
    if first is None:
        return None
    if last < first:  # the run crossed new year
        last = last.replace(year=year + 1)
    return (last - first).total_seconds()


def _log_numbers(path):
    """(overall train s/iter or None, [inference seconds per evaluation]) from log.txt."""
    speed, inference = None, []
    with open(path, errors="replace") as f:
        for line in f:
            m = _SPEED.search(line)
            if m:
                speed = float(m.group(1))
            m = _INFERENCE.search(line)
            if m:
                h, mi, s = m.groups()
                inference.append(int(h) * 3600 + int(mi) * 60 + float(s))
    return speed, inference


def _metrics_time(path):
    """The last ``time`` (s/iter, detectron2's smoothed step time) in metrics.json, or None."""
    value = None
    if os.path.isfile(path):
        with open(path) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict) and "time" in record:
                    value = float(record["time"])
    return value


def arm_timings(arm_dir):
    log = os.path.join(arm_dir, "log.txt")
    if not os.path.isfile(log):
        return {"wall_s": None, "train_s_per_iter": None, "inference_s": []}
    speed, inference = _log_numbers(log)
    if speed is None:
        speed = _metrics_time(os.path.join(arm_dir, "metrics.json"))
    return {"wall_s": _log_span_s(log), "train_s_per_iter": speed, "inference_s": inference}


def _fmt(value, spec):
    return "n/a" if value is None or value != value else format(value, spec)


def summarize(output_dir, max_iter):
    """Table rows per arm and the names of arms whose final evaluation is missing."""
    from condinit_det.report import compare_arms

    # One seed per arm: <output>/<arm>/seed<k>/ (condinit_det.records.layout).
    arm_dirs = [
        next(iter(sorted(glob.glob(os.path.join(output_dir, arm, "seed*")))), os.path.join(output_dir, arm))
        for arm in ARMS
    ]
    present = [d for d in arm_dirs if os.path.isfile(os.path.join(d, "results.json"))]
    report = None
    if present:
        try:
            report = compare_arms(present)[0]
        except ValueError as e:  # e.g. a run without any "ap" record
            print(f"cannot summarize the runs: {e}")
    rows, incomplete = [], []
    for arm, arm_dir in zip(ARMS, arm_dirs):
        t = arm_timings(arm_dir)
        summary = None
        if report is not None:
            try:
                summary = report.arm(arm)
            except KeyError:
                pass
        final_it = max(summary.final_iterations) if summary is not None else None
        box = summary.final["AP^b"][0] if summary is not None else None
        mask = summary.final["AP^m"][0] if summary is not None else None
        if final_it is None or final_it < max_iter:
            incomplete.append(arm)
        rows.append(
            [
                arm,
                _fmt(t["wall_s"], ".0f"),
                _fmt(t["train_s_per_iter"], ".3f"),
                len(t["inference_s"]),
                _fmt(sum(t["inference_s"]) if t["inference_s"] else None, ".1f"),
                "n/a" if final_it is None else final_it,
                _fmt(box, ".2f"),
                _fmt(mask, ".2f"),
            ]
        )
    return rows, incomplete


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--config-file", default=DEFAULT_CONFIG, metavar="FILE", help=f"lazy demo config (default: {DEFAULT_CONFIG})"
    )
    parser.add_argument(
        "--output",
        default=None,
        metavar="DIR",
        help="new or empty directory to train into and keep (default: a temporary one)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_ITERS} iterations per arm, one evaluation on {QUICK_TEST_IMAGES} images",
    )
    parser.add_argument(
        "--opts",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides passed to train_net (after --quick's, so they win)",
    )
    args = parser.parse_args(argv)
    if any(o.split("=", 1)[0].lstrip("+~") == "train.output_dir" for o in args.opts):
        parser.error("set the output directory with --output, not train.output_dir")
    config_file = resolve_config(args.config_file)

    if args.output is not None:
        if os.path.exists(args.output) and (not os.path.isdir(args.output) or os.listdir(args.output)):
            parser.error(
                f"--output {args.output} exists and is not an empty directory; timings must "
                "come from this run alone, so give a new or empty directory"
            )
        output_dir = os.path.abspath(args.output)
        os.makedirs(output_dir, exist_ok=True)
    else:
        output_dir = tempfile.mkdtemp(prefix="bench_demo_")

    from detectron2.config import LazyConfig

    opts = (quick_overrides(LazyConfig.load(config_file)) if args.quick else []) + list(args.opts)
    cfg = load_checked(config_file, opts)
    max_iter = int(cfg.train.max_iter)
    cmd = [
        sys.executable,
        os.path.join(ROOT, "tools", "train_net.py"),
        "--config-file",
        config_file,
        "--arm",
        "all",
        *opts,
        f"train.output_dir={output_dir}",
    ]
    console = os.path.join(output_dir, "train_net.log")

    print(format_machine_info(machine_info()))
    print("command: " + " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd[1:]))
    print(f"schedule: {max_iter} iterations per arm, evaluation every {cfg.train.eval_period}", flush=True)
    try:
        start = time.perf_counter()
        with open(console, "w") as out:
            proc = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        total_s = time.perf_counter() - start
        if proc.returncode != 0:
            with open(console, errors="replace") as f:
                tail = f.readlines()[-60:]
            print("".join(tail))
            print(f"FAIL: train_net exited with status {proc.returncode} after {total_s:.0f} s")
            return 1
        rows, incomplete = summarize(output_dir, max_iter)
        report_md = os.path.join(output_dir, "report", "report.md")
        print()
        print(
            format_table(
                ["arm", "wall s", "train s/iter", "evaluations", "inference s", "final iter", "box AP", "mask AP"], rows
            )
        )
        arm_walls = [float(r[1]) for r in rows if r[1] != "n/a"]
        print()
        print(
            f"total wall: {total_s:.0f} s (arms {sum(arm_walls):.0f} s; start-up and report "
            f"{total_s - sum(arm_walls):.0f} s); median arm {median(arm_walls) if arm_walls else float('nan'):.0f} s"
        )
        if args.quick:
            print(
                f"(quick mode: {QUICK_ITERS} iterations, APs on a {QUICK_TEST_IMAGES}-image subset; not "
                "comparable with a full run)"
            )
        if args.output is not None:
            print(f"run directories and report: {output_dir} ({os.path.relpath(report_md, output_dir)})")
        if not os.path.isfile(report_md):
            print(f"FAIL: train_net did not write the comparison report {report_md}")
            return 1
        if incomplete:
            print(f"FAIL: no final evaluation at iteration {max_iter} for: {', '.join(incomplete)}")
            return 1
        print(f"OK: {len(ARMS)} arms trained and evaluated at iteration {max_iter}")
        return 0
    finally:
        if args.output is None:
            shutil.rmtree(output_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
