#!/usr/bin/env python
"""Cost of measuring kappa of the attention Jacobian: exact per head vs matrix-free (BENCHMARKS.md sections 5, 7).

    python bench/bench_conditioning.py            # parts 1-3 (about 15 minutes on 2 CPU cores)
    python bench/bench_conditioning.py --quick    # small layers, seconds
    python bench/bench_conditioning.py --fraction configs/COCO/mask_rcnn_swin_b_3x.py --images-per-gpu 2
    python bench/bench_conditioning.py --fraction configs/demo/pretrain_vit_tiny.py configs/demo/pretrain_xcit_tiny.py
    python bench/bench_conditioning.py --threads 1 --clock cpu --ends    # (--quick: smaller sites, seconds)

1. A ViT attention layer small enough for a dense Jacobian: time and kappa of the exact per-head method, the
   dense Jacobian's singular values (torch.func) and the matrix-free estimate (block Lanczos) to convergence.
2. ViTDet-B sites (768 wide, 12 heads, rel-pos): exact vs matrix-free (60 steps x 8) at 16 tokens, matrix-free
   (8 x 8) at a full 14x14 window, exact at the largest grid that fits in 10 minutes (``--exact-side``).
3. The training hook of ``configs/COCO/mask_rcnn_vitdet_b_100ep.py`` (``--quick``: the ViT demo config): one
   measurement on a fixed 768 x 1024 image, timed, and the method each site used.
4. ``--fraction CONFIG ...``: the share of training time each config's own ``condinit_analysis`` node costs,
   ``measurements x s per measurement / (max_iter x s per step)``, from one measurement on a ``--test-size``
   image and ``--steps`` float32 steps (after a warm-up) on ``--images-per-gpu`` synthetic ``--train-size``
   images. A pretraining config is set up as its run would be: two measurements (the first pays one-time
   costs), steps on its own loader and one evaluation; the share is over the epochs' seconds.
5. ``--ends``: the exact method's last step on the head factors of two sites: every singular value (SVD of
   the QR factor R) vs sigma_max and sigma_min by Lanczos on R, their times and largest relative difference.

``--clock cpu`` times in this process's CPU seconds (with ``--threads 1``, for a busy machine). Prints Markdown
tables and one JSON summary (``--output`` saves it), with the load average before and after.
"""

import argparse
import json
import math
import os
import platform
import sys
import time

import torch

from condinit_det.analysis import AttentionFunction, estimate_conditioning, exact_conditioning
from condinit_det.analysis.functional import eval_mode
from condinit_det.init import ARMS, apply_init, find_attention
from condinit_det.utils.fileio import atomic_write

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ modules, however invoked
from common import load_average  # noqa: E402
from synthetic_coco import detection_batches  # noqa: E402


def _layer(dim, heads, side, arm, window=False):
    """The attention site of a detectron2 ViT attention (rel-pos) on side x side layer-normed Gaussian tokens, or with
    ``window`` of a Swin window attention on one side x side window; returns (site, inputs)."""
    from detectron2.modeling.backbone.swin import WindowAttention
    from detectron2.modeling.backbone.vit import Attention

    torch.manual_seed(0)
    if window:
        module, tokens = WindowAttention(dim, window_size=(side, side), num_heads=heads), (side * side,)
    else:
        module = Attention(dim, num_heads=heads, use_rel_pos=True, input_size=(side, side), rel_pos_zero_init=False)
        tokens = (side, side)
    apply_init(module, arm, seed=0)
    x = torch.randn(1, *tokens, dim, generator=torch.Generator().manual_seed(1))
    return find_attention(module)[0], {"x": torch.nn.functional.layer_norm(x, (dim,))}


# What the timings read: wall-clock seconds, or with ``--clock cpu`` this process's CPU seconds (on a busy machine
# they stay what the work costs, where wall-clock seconds grow with the other load; with one thread they equal the
# wall-clock seconds of an idle machine).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = CLOCKS["wall"]


def _timed(fn):
    start = _clock()
    out = fn()
    return out, _clock() - start


def _dense_kappa(site, inputs):
    """kappa from every singular value of the dense Jacobian (the reference; small layers only)."""
    fn = AttentionFunction(site, inputs)
    with eval_mode(fn.module):
        s = torch.linalg.svdvals(torch.func.jacrev(fn.flat)(fn.theta()))
    return float(s[0] / s[-1])


def bench_small(dim, heads, side, arm, tol, max_iter, block):
    site, inputs = _layer(dim, heads, side, arm)
    exact, t_exact = _timed(lambda: exact_conditioning(site, inputs))
    kappa_dense, t_dense = _timed(lambda: _dense_kappa(site, inputs))
    free, t_free = _timed(lambda: estimate_conditioning(site, inputs, tol=tol, max_iter=max_iter, block_size=block))
    return {
        "layer": f"d2 ViT attention, {dim} wide, {heads} heads, {side}x{side} tokens, rel-pos, arm {arm}",
        "shape": list(exact.shape),
        "exact_s": t_exact,
        "dense_s": t_dense,
        "matrix_free_s": t_free,
        "kappa_exact": exact.kappa,
        "kappa_dense": kappa_dense,
        "kappa_matrix_free": free.kappa,
        "exact_vs_dense_rel": abs(exact.kappa - kappa_dense) / kappa_dense,
        "converged": free.converged,
        "products": free.products,
    }


def bench_site(dim, heads, side, arm, methods, max_iter, block, tol):
    """One ViTDet-B-like site at side x side tokens: each of ``methods`` timed in turn."""
    site, inputs = _layer(dim, heads, side, arm)
    out = {"layer": f"d2 ViT attention, {dim} wide, {heads} heads, {side}x{side} tokens, rel-pos, arm {arm}"}
    if "exact" in methods:
        res, sec = _timed(lambda: exact_conditioning(site, inputs, max_entries=10**9))
        out["exact"] = {
            "s": sec,
            "kappa": res.kappa,
            "sigma_max": res.sigma_max,
            "sigma_min": res.sigma_min,
            "converged": True,
            "structure": res.structure,
            "shape": list(res.shape),
            "kappa_heads_median": sorted(res.kappa_heads)[len(res.kappa_heads) // 2],
        }
    if "matrix_free" in methods:
        res, sec = _timed(lambda: estimate_conditioning(site, inputs, tol=tol, max_iter=max_iter, block_size=block))
        out["matrix_free"] = {
            "s": sec,
            "kappa": res.kappa,
            "sigma_max": res.sigma_max,
            "sigma_min": res.sigma_min,
            "converged": res.converged,
            "steps": res.iterations,
            "block_size": block,
            "shape": list(res.shape),
        }
    return out


def _time_hook(cfg, config, image):
    """Build ``cfg.model`` (global seed 0) and its conditioning hook on one image ``[3, H, W]``; time one
    measurement. Returns (model, the measurement's records, seconds)."""
    from detectron2.config import instantiate

    from condinit_det.analysis.hooks import build_conditioning_hook

    torch.manual_seed(0)
    model = instantiate(cfg.model)
    height, width = image.shape[-2:]
    hook = build_conditioning_hook(
        cfg, batch=[{"image": image, "height": height, "width": width}], config_name=os.path.basename(config)
    )

    class _Trainer:  # what the hook reads from a detectron2 trainer
        pass

    hook.trainer = _Trainer()
    hook.trainer.model = model
    records, sec = _timed(lambda: hook.measure(0))
    return model, records, sec


def bench_hook(config, arm, height, width):
    """Seconds of one ConditioningHook measurement built from ``config``'s ``condinit_analysis`` node."""
    from detectron2.config import LazyConfig

    cfg = LazyConfig.load(config)
    cfg.condinit.arm = arm
    cfg.condinit_analysis.period = 1000
    cfg.train.output_dir = ""
    image = torch.rand(3, height, width, generator=torch.Generator().manual_seed(0)) * 255
    _, records, sec = _time_hook(cfg, config, image)
    return {
        "config": config,
        "arm": arm,
        "image": [height, width],
        "seconds": sec,
        "sites": [{k: r[k] for k in ("site", "method", "structure", "kappa", "converged", "tokens")} for r in records],
    }


def bench_ends(arm, quick=False):
    """The exact method's last step on the head factors of two sites the hooks measure: all singular values (the
    QR factor's SVD, the route before) against the extreme two (:func:`extreme_singular_values`: Lanczos on the
    QR factor), timed in turn in the same process, with the largest relative difference of sigma_max / sigma_min.
    quick: smaller sites whose factors still have more than 256 singular values (the Lanczos route)."""
    from condinit_det.analysis.heads import head_factors
    from condinit_det.analysis.spectrum import extreme_singular_values, singular_values

    if quick:
        layers = {
            "ViT attention (64 wide, 2 heads), 4x4 = 16 tokens": _layer(64, 2, 4, arm),
            "Swin window attention (32 wide, 2 heads), one 6x6 window": _layer(32, 2, 6, arm, window=True),
        }
    else:
        layers = {
            "ViTDet-B block (768 wide, 12 heads), 4x4 = 16 tokens": _layer(768, 12, 4, arm),
            "demo Swin first block (48 wide, 2 heads), one 8x8 window": _layer(48, 2, 8, arm, window=True),
        }
    rows = []
    for name, (site, inputs) in layers.items():
        factors = head_factors(AttentionFunction(site, inputs))[0]
        every, every_s = _timed(lambda fs=factors: [singular_values(f) for f in fs])
        ends, ends_s = _timed(lambda fs=factors: [extreme_singular_values(f) for f in fs])
        diff = max(
            max(abs(top - float(s[0])) / float(s[0]), abs(low - float(s[-1])) / float(s[-1]))
            for s, (top, low) in zip(every, ends)
        )
        kappa = max(float(s[0] / s[-1]) for s in every)
        rows.append(
            {
                "layer": f"{name}, arm {arm}",
                "factor": list(factors[0].shape),
                "heads": len(factors),
                "all_s": every_s,
                "ends_s": ends_s,
                "ratio": ends_s / every_s,
                "max_rel_diff": diff,
                "kappa_max_head": kappa,
            }
        )
    return rows


def _size(text):
    """``"HxW"`` -> (H, W)."""
    try:
        height, width = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size HxW such as 640x853, got {text!r}") from None
    if height < 32 or width < 32:
        raise argparse.ArgumentTypeError(f"sizes must be at least 32x32, got {text!r}")
    return height, width


def measurement_count(max_iter, period):
    """Measurements the hook makes in a run: at the start, every ``period`` iterations, and at the end."""
    return 1 + max_iter // period + (1 if max_iter % period else 0)


def bench_fraction(config, arm, train_size, test_size, images_per_gpu, steps, opts=()):
    """Seconds of one measurement of ``config``'s own ``condinit_analysis`` hook and of its training step,
    and the share of training time the hook costs at the configured period (see the module doc)."""
    from detectron2.config import LazyConfig, instantiate
    from detectron2.utils.events import EventStorage

    cfg = LazyConfig.apply_overrides(LazyConfig.load(config), list(opts))
    cfg.condinit.arm = arm
    cfg.train.output_dir = ""
    period = int(cfg.condinit_analysis.period)
    if period <= 0:
        raise SystemExit(f"{config}: condinit_analysis.period is {period}; the hook is off, there is nothing to time")
    height, width = test_size
    image = torch.randint(0, 256, (3, height, width), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)
    model, records, hook_s = _time_hook(cfg, config, image)

    model.train()
    cfg.optimizer.params.model = model
    optimizer = instantiate(cfg.optimizer)
    heads = getattr(model, "roi_heads", None)
    num_classes = heads.num_classes if heads is not None else model.class_head.out_features - 1  # DETR: + no-object
    batch = detection_batches(num=1, batch=images_per_gpu, size=train_size, num_classes=num_classes, seed=0)[0]

    def step():
        with EventStorage(0):
            losses = model(batch)
            total = losses if isinstance(losses, torch.Tensor) else sum(losses.values())
            optimizer.zero_grad()
            total.backward()
            optimizer.step()

    step()  # warm-up: first-use allocations
    step_times = [_timed(step)[1] for _ in range(steps)]
    step_s = sorted(step_times)[len(step_times) // 2]
    max_iter = int(cfg.train.max_iter)
    count = measurement_count(max_iter, period)
    return {
        "config": config,
        "arm": arm,
        "period": period,
        "sites": [r["site"] for r in records],
        "methods": [r["method"] for r in records],
        "structures": [r["structure"] for r in records],
        "tokens": [r["tokens"] for r in records],
        "test_image": list(test_size),
        "train_image": list(train_size),
        "images_per_gpu": images_per_gpu,
        "hook_s": hook_s,
        "step_s": step_s,
        "step_times": step_times,
        "max_iter": max_iter,
        "measurements": count,
        "fraction": count * hook_s / (max_iter * step_s),
        "period_for_1_percent": math.ceil(100 * hook_s / step_s),
    }


def is_pretraining_config(config):
    """Whether ``config`` is a pretraining config (a timm ``model.name``, no detectron2 data loaders)."""
    from detectron2.config import LazyConfig

    cfg = LazyConfig.load(config)
    model = cfg.get("model")
    return "dataloader" not in cfg and model is not None and "name" in model and "_target_" not in model


def bench_pretrain_fraction(config, arm, steps, opts=()):
    """Seconds of measurements by ``config``'s own ``condinit_analysis`` node in pretraining, of a training step and
    of an evaluation, and the share of training time the measurements cost (see the module doc)."""
    import tempfile

    from condinit_det.pretrain import PretrainRun, load_config
    from condinit_det.pretrain.evaluate import evaluate

    cfg = load_config(config, [*opts, f"condinit.arm={arm}"])
    if cfg.get("condinit_analysis") is None or int(cfg.condinit_analysis.get("period", 0) or 0) <= 0:
        raise SystemExit(f"{config}: condinit_analysis.period is not positive; nothing to time")
    with tempfile.TemporaryDirectory() as tmp:
        cfg.train.output_dir = tmp
        run = PretrainRun(cfg, tmp, config_file=config)
        run.setup()
        probe = run.conditioning
        records, first_s = _timed(lambda: probe.measure(run.model, epoch=0, step=0))
        _, second_s = _timed(lambda: probe.measure(run.model, epoch=1, step=0))

        run.start_epoch(0)
        run.model.train()
        batches = iter(run.loader)
        step_times = []
        for i in range(steps + 1):  # the first step is a warm-up
            start = _clock()
            images, targets = next(batches)
            run.optimization(run.model, images.to(run.device), targets.to(run.device), step=i + 1)
            step_times.append(_clock() - start)
        del batches  # stops the loader's workers
        step_times = step_times[1:]
        step_s = sorted(step_times)[len(step_times) // 2]
        train = run.train_node
        eval_batch = int(train["eval_batch_size"] or max(1, int(1.5 * run.batch)))
        _, eval_s = _timed(
            lambda: evaluate(
                run.model, run.datasets.val, device=run.device, batch_size=eval_batch, workers=int(train["workers"])
            )
        )
        epochs, period, per_epoch = run.num_epochs, probe.period, run.steps_per_epoch
    eval_period = max(int(train["eval_period"]), 1)
    epoch_s = per_epoch * step_s + eval_s / eval_period

    def share(every):
        count = measurement_count(epochs, every)
        return count, (first_s + (count - 1) * second_s) / (epochs * epoch_s)

    count, fraction = share(period)
    total_s = fraction * epochs * epoch_s
    within_5 = next((p for p in range(1, epochs + 1) if share(p)[1] <= 0.05), None)
    return {
        "config": config,
        "arm": arm,
        "period": period,
        "unit": "epoch",
        "sites": [r["site"] for r in records],
        "methods": [r["method"] for r in records],
        "tokens": [r["tokens"] for r in records],
        "first_measurement_s": first_s,
        "measurement_s": second_s,
        "mean_measurement_s": total_s / count,
        "batch_size": run.batch,
        "step_s": step_s,
        "step_times": step_times,
        "steps_per_epoch": per_epoch,
        "eval_s": eval_s,
        "eval_period": eval_period,
        "epoch_s": epoch_s,
        "epochs": epochs,
        "measurements": count,
        "fraction": fraction,
        "period_for_5_percent": within_5,
    }


def print_pretrain_fraction(f):
    print(
        f"| {os.path.relpath(f['config'])} | {', '.join(f['sites'])} | {f['first_measurement_s']:.2f} / "
        f"{f['measurement_s']:.2f} | {f['batch_size']} images: {f['step_s']:.3f} | {f['steps_per_epoch']} | "
        f"{f['eval_s']:.1f} | {f['epoch_s']:.1f} | {f['period']} | {f['measurements']} of {f['epochs']} ep | "
        f"{100 * f['fraction']:.2f}% | {f['period_for_5_percent'] or 'none'} |",
        flush=True,
    )


PRETRAIN_HEADER = (
    "| config | sites | s per measurement (first / then) | s per step | steps per epoch | "
    "s per evaluation | s per epoch | period (epochs) | measurements | share of training | "
    "period for 5% |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def print_fraction(f):
    print(
        f"| {os.path.relpath(f['config'])} | {', '.join(f['sites'])} | "
        f"{f['hook_s']:.1f} | {f['images_per_gpu']} x {f['train_image'][0]}x{f['train_image'][1]} | "
        f"{f['step_s']:.1f} | {f['period']} | {f['measurements']} of {f['max_iter']} it | "
        f"{100 * f['fraction']:.3f}% | {f['period_for_1_percent']} |",
        flush=True,
    )


FRACTION_HEADER = (
    "| config | sites | s per measurement | step batch | s per step | period | measurements | "
    "share of training | period for 1% |\n|---|---|---|---|---|---|---|---|---|"
)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small layers and a short budget (seconds)")
    p.add_argument("--arm", default="conditioned", choices=ARMS)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--exact-side", type=int, default=7, help="grid side of the largest exact measurement")
    p.add_argument("--output", default=None, help="save the JSON summary here")
    p.add_argument(
        "--fraction",
        nargs="+",
        default=None,
        metavar="CONFIG",
        help="only part 4: the training-time share of each config's condinit_analysis node "
        "(detection or pretraining configs)",
    )
    p.add_argument(
        "--train-size",
        type=_size,
        default=(640, 853),
        metavar="HxW",
        help="training image size for --fraction (default 640x853: the multi-scale recipes' mean)",
    )
    p.add_argument(
        "--test-size",
        type=_size,
        default=(800, 1067),
        metavar="HxW",
        help="the hook's test image size for --fraction (default 800x1067)",
    )
    p.add_argument("--images-per-gpu", type=int, default=2, help="images per training step for --fraction")
    p.add_argument("--steps", type=int, default=1, help="timed training steps per config for --fraction")
    p.add_argument("--opts", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides for --fraction")
    p.add_argument(
        "--ends",
        action="store_true",
        help="only the exact method's last step: all singular values of each head factor vs the extreme "
        "two (Lanczos on the QR factor)",
    )
    p.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="time in wall-clock seconds (default) or in this process's CPU seconds (a busy machine)",
    )
    args = p.parse_args(argv)
    global _clock
    _clock = CLOCKS[args.clock]
    if args.images_per_gpu < 1 or args.steps < 1:
        p.error("--images-per-gpu and --steps must be >= 1")
    torch.set_num_threads(args.threads)
    if args.fraction:
        return main_fraction(args)
    if args.ends:
        return main_ends(args)
    if args.quick:
        small = dict(dim=8, heads=2, side=3, max_iter=20, block=8)
        site = dict(dim=48, heads=3)
        sides, big_side, exact_side, budget = (2,), 4, 3, dict(max_iter=2, block=4, tol=1e-4)
        big_budget = budget
    else:
        small = dict(dim=24, heads=4, side=6, max_iter=200, block=16)
        site = dict(dim=768, heads=12)
        sides, big_side, exact_side, budget = (4,), 14, args.exact_side, dict(max_iter=60, block=8, tol=1e-4)
        big_budget = dict(max_iter=8, block=8, tol=1e-4)
    result = _begin(args, quick=args.quick)
    a = result["small_layer"] = bench_small(
        small["dim"], small["heads"], small["side"], args.arm, 1e-6, small["max_iter"], small["block"]
    )
    print("| layer | J shape | exact (per head) | dense | matrix-free | κ exact | κ dense | κ matrix-free |")
    print("|---|---|---|---|---|---|---|---|")
    print(
        f"| {a['layer']} | {a['shape'][0]}x{a['shape'][1]} | {a['exact_s']:.2f} s | {a['dense_s']:.2f} s | "
        f"{a['matrix_free_s']:.2f} s | {a['kappa_exact']:.6g} | {a['kappa_dense']:.6g} | "
        f"{a['kappa_matrix_free']:.4g} ({'converged' if a['converged'] else 'not converged'}) |",
        flush=True,
    )
    hook_config = os.path.join(
        os.path.dirname(os.path.abspath(__file__)),
        os.pardir,
        "configs",
        "demo/mask_rcnn_vit_tiny.py" if args.quick else "COCO/mask_rcnn_vitdet_b_100ep.py",
    )
    plan = [(side, ("exact",)) for side in sides] + [("hook", ())] + [(side, ("matrix_free",)) for side in sides]
    plan += [(big_side, ("matrix_free",)), (exact_side, ("exact",))]
    result["sites"] = []
    print()
    print("| layer | J shape | method | seconds | κ | σ_max | σ_min | converged |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    for side, methods in plan:
        if side == "hook":
            h = result["hook"] = bench_hook(hook_config, args.arm, *((96, 128) if args.quick else (768, 1024)))
            print(
                f"training hook, {os.path.relpath(h['config'])} (arm {h['arm']}, one {h['image'][0]}x"
                f"{h['image'][1]} image): {h['seconds']:.1f} s per measurement; sites: "
                + "; ".join(
                    f"{r['site']} {r['tokens']} tokens {r['method']} ({r['structure'] or 'Lanczos'}) "
                    f"κ {r['kappa']:.4g} converged {'yes' if r['converged'] else 'no'}"
                    for r in h["sites"]
                ),
                flush=True,
            )
            continue
        b = bench_site(
            site["dim"], site["heads"], side, args.arm, methods, **(big_budget if side == big_side else budget)
        )
        result["sites"].append(b)
        for method in methods:
            r = b[method]
            label = "exact (per head)" if method == "exact" else f"matrix-free ({r['steps']}x{r['block_size']})"
            print(
                f"| {b['layer']} | {r['shape'][0]}x{r['shape'][1]} | {label} | {r['s']:.1f} | {r['kappa']:.4g} | "
                f"{r['sigma_max']:.4g} | {r['sigma_min']:.4g} | {'yes' if r['converged'] else 'no'} |",
                flush=True,
            )
    if args.quick:
        demo = os.path.join(
            os.path.dirname(os.path.abspath(__file__)), os.pardir, "configs", "demo/mask_rcnn_vit_tiny.py"
        )
        f = result["fraction"] = bench_fraction(demo, args.arm, (96, 128), (96, 128), 1, 1)
        print()
        print(FRACTION_HEADER)
        print_fraction(f)
    rel = a["exact_vs_dense_rel"]
    return _end(
        result,
        args,
        f"OK: exact per-head kappa equals the dense Jacobian's (relative {rel:.1e})"
        if rel <= 1e-9
        else f"MISMATCH: exact per-head vs dense kappa differ by {rel:.1e} (relative)",
    )


def _begin(args, **fields):
    """The summary's header: machine, thread count, clock and load average before (printed too), then ``fields``."""
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
        f"{torch.__version__}, {args.threads} threads",
        "load_before": load_average(),
        "clock": args.clock,
        **fields,
    }
    print(f"load average before: {result['load_before']} ({result['machine']}; {args.clock} seconds)", flush=True)
    return result


def _end(result, args, verdict=""):
    """Print the load average after and ``verdict``, then the summary as JSON (saved to ``--output`` too)."""
    result["load_after"] = load_average()
    print(f"load average after: {result['load_after']}")
    if verdict:
        print(verdict)
    text = json.dumps(result, indent=1)
    print(text)
    if args.output:
        atomic_write(args.output, text)
    return result


def main_ends(args):
    result = _begin(args)
    rows = result["ends"] = bench_ends(args.arm, quick=args.quick)
    print(
        "| layer | head factors | all singular values | extreme two | ratio | max relative difference | "
        "largest head κ |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['layer']} | {r['heads']} × {r['factor'][0]}×{r['factor'][1]} | {r['all_s']:.2f} s | "
            f"{r['ends_s']:.2f} s | {r['ratio']:.2f} | {r['max_rel_diff']:.1e} | {r['kappa_max_head']:.4g} |"
        )
    worst = max(r["max_rel_diff"] for r in rows)
    return _end(
        result,
        args,
        f"OK: the extreme two equal the full SVD's ends (relative {worst:.1e})"
        if worst <= 1e-9
        else f"MISMATCH: the extreme two and the full SVD's ends differ by {worst:.1e} (relative)",
    )


def main_fraction(args):
    result = _begin(args, fractions=[])
    header = None
    for config in args.fraction:
        if is_pretraining_config(config):
            f = bench_pretrain_fraction(config, args.arm, args.steps, args.opts)
            show, table = print_pretrain_fraction, PRETRAIN_HEADER
        else:
            f = bench_fraction(
                config, args.arm, args.train_size, args.test_size, args.images_per_gpu, args.steps, args.opts
            )
            show, table = print_fraction, FRACTION_HEADER
        if table != header:
            print(("\n" if header else "") + table, flush=True)
            header = table
        result["fractions"].append(f)
        show(f)
    return _end(result, args)


if __name__ == "__main__":
    main()
