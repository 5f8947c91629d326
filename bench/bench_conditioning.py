#!/usr/bin/env python
"""Cost of measuring kappa of the attention Jacobian: matrix-free vs exact, and on a ViT-B layer.

1. On one detectron2 ViT attention layer small enough for the dense Jacobian: time of the exact
   computation (jacrev/jacfwd + SVD, float64) and of the matrix-free estimate (block Lanczos on
   jvp/vjp products) run to convergence, in the same process; their ratio and the agreement.
2. On a ViT-B-sized layer (768 wide, 12 heads, 14x14 = 196 tokens): time of one matrix-free
   estimate with a fixed budget of block-Lanczos steps, as a multiple of one float64 forward
   pass of the same layer measured in the same run (the dense Jacobian there would have
   150528 x 1769472 entries, 2 TiB).

    python bench/bench_conditioning.py            # full (minutes on 2 CPU cores)
    python bench/bench_conditioning.py --quick    # small layers, seconds

Prints a Markdown summary and one JSON object (``--output`` also saves it). Numbers depend on
the machine's load, which is printed with them.
"""
import argparse
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from condinit_det.analysis import AttentionFunction, estimate_conditioning, exact_conditioning  # noqa: E402
from condinit_det.fileio import atomic_write  # noqa: E402
from condinit_det.init import apply_init, find_attention  # noqa: E402


def _layer(dim, heads, side, arm, seed=0):
    from detectron2.modeling.backbone.vit import Attention

    torch.manual_seed(seed)
    module = Attention(dim, num_heads=heads, use_rel_pos=True, input_size=(side, side), rel_pos_zero_init=False)
    apply_init(module, arm, seed=seed)
    site = find_attention(module)[0]
    x = torch.nn.functional.layer_norm(torch.randn(1, side, side, dim, generator=torch.Generator().manual_seed(1)),
                                       (dim,))
    return site, {"x": x}


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _load():
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def bench_exact_vs_free(dim, heads, side, arm, tol, max_iter, block):
    site, inputs = _layer(dim, heads, side, arm)
    exact, t_exact = _timed(lambda: exact_conditioning(site, inputs))
    free, t_free = _timed(lambda: estimate_conditioning(site, inputs, tol=tol, max_iter=max_iter, block_size=block))
    return {
        "layer": f"d2 ViT attention, {dim} wide, {heads} heads, {side}x{side} tokens, rel-pos, arm {arm}",
        "shape": list(exact.shape),
        "exact_s": t_exact,
        "matrix_free_s": t_free,
        "ratio_free_over_exact": t_free / t_exact,
        "kappa_exact": exact.kappa,
        "kappa_matrix_free": free.kappa,
        "rel_error": abs(free.kappa - exact.kappa) / exact.kappa,
        "converged": free.converged,
        "block_steps": free.iterations,
        "products": free.products,
    }


def bench_large(dim, heads, side, arm, max_iter, block):
    site, inputs = _layer(dim, heads, side, arm)
    fn = AttentionFunction(site, inputs)
    site.module.eval()
    theta = fn.weights
    with torch.no_grad():
        fn(*theta)
        _, t_fwd = _timed(lambda: [fn(*theta) for _ in range(3)])
    t_fwd /= 3
    free, t_free = _timed(lambda: estimate_conditioning(fn, tol=1e-4, max_iter=max_iter, block_size=block))
    return {
        "layer": f"d2 ViT attention, {dim} wide, {heads} heads, {side}x{side} tokens, rel-pos, arm {arm}",
        "shape": [fn.rows, fn.cols],
        "forward_s": t_fwd,
        "matrix_free_s": t_free,
        "ratio_free_over_forward": t_free / t_fwd,
        "block_steps": free.iterations,
        "block_size": block,
        "products": free.products,
        "kappa_matrix_free": free.kappa,
        "sigma_max": free.sigma_max,
        "sigma_min": free.sigma_min,
        "converged": free.converged,
        "residual_min": free.residual_min,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small layers and a short budget (seconds)")
    p.add_argument("--arm", default="default", choices=("default", "mimetic", "conditioned"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--output", default=None, help="save the JSON summary here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.quick:
        small = dict(dim=8, heads=2, side=3, max_iter=20, block=8)
        large = dict(dim=96, heads=3, side=7, max_iter=2, block=4)
    else:
        small = dict(dim=24, heads=4, side=6, max_iter=200, block=16)
        large = dict(dim=768, heads=12, side=14, max_iter=8, block=8)
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
                   f"{torch.__version__}, {args.threads} threads",
        "load_before": _load(),
        "quick": args.quick,
        "exact_vs_matrix_free": bench_exact_vs_free(small["dim"], small["heads"], small["side"], args.arm, 1e-6,
                                                    small["max_iter"], small["block"]),
        "large_layer": bench_large(large["dim"], large["heads"], large["side"], args.arm, large["max_iter"],
                                   large["block"]),
        "load_after": _load(),
    }
    a, b = result["exact_vs_matrix_free"], result["large_layer"]
    print(f"load average before/after: {result['load_before']} / {result['load_after']} ({result['machine']})")
    print("| layer | J shape | exact | matrix-free | ratio | kappa exact | kappa matrix-free | converged |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {a['layer']} | {a['shape'][0]}x{a['shape'][1]} | {a['exact_s']:.2f} s | {a['matrix_free_s']:.2f} s | "
          f"{a['ratio_free_over_exact']:.2f}x | {a['kappa_exact']:.4g} | {a['kappa_matrix_free']:.4g} | "
          f"{a['converged']} ({a['products']} products) |")
    print()
    print("| layer | J shape | one forward | matrix-free | ratio | steps x block | kappa (lower est. if not converged) "
          "| converged |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {b['layer']} | {b['shape'][0]}x{b['shape'][1]} | {b['forward_s']:.3f} s | {b['matrix_free_s']:.1f} s | "
          f"{b['ratio_free_over_forward']:.0f}x | {b['block_steps']}x{b['block_size']} | {b['kappa_matrix_free']:.4g} | "
          f"{b['converged']} |")
    text = json.dumps(result, indent=1)
    print(text)
    if args.output:
        atomic_write(args.output, text)
    return result


if __name__ == "__main__":
    main()
