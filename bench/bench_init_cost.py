"""Cost of applying each arm, as a fraction of the time to build the model (CPU).

    python bench/bench_init_cost.py                      # ViTDet-B, Swin-B, ViTDet-L, ViTDet-H Mask R-CNN
    python bench/bench_init_cost.py --models vitdet_b    # a subset
    python bench/bench_init_cost.py --quick              # the tiny demo model only
    python bench/bench_init_cost.py --device cuda --models vitdet_b,vitdet_l,vitdet_h   # arms on a GPU
    python bench/bench_init_cost.py --models vitdet_b --solvers   # mimetic: dense SVD vs the "auto" route

"build" is ``instantiate(cfg.model)`` with the config's arm set to "default" (which changes nothing); each arm is
then timed as ``condinit_det.init.apply_init(model, arm, seed=0, include=cfg.condinit.include)`` on that model,
one after the other (an arm overwrites what it targets and never reads it, so its cost does not depend on an
earlier arm). Each measurement (one build, each arm once) runs in a fresh process, as in a training run (a
second build in one process is up to 2x faster); ``--repeats`` processes per model, medians reported. With
``--device cuda`` the move to the GPU is part of "build" and the arms run there, both timed to a
``torch.cuda.synchronize()``. ``--solvers``: mimetic with ``solver="auto"`` and ``solver="dense"`` (a float64 SVD
per head) on two copies of each model: the seconds of each and how far the dense route moves the weights and
each head's ``W_q^T W_k`` (relative Frobenius). Wall seconds are the headline, this process's CPU seconds beside
them. Budget: conditioned <= 0.3x the build time, mimetic <= 12x.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import format_machine_info, format_table, load_average, machine_info, parse_names  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ViT-L/H follow ViTDet's published variants of the ViT-B config: (embed_dim, depth, heads,
# drop_path_rate, global-attention block indexes).
VIT_SIZES = {
    "vitdet_l": (1024, 24, 16, 0.4, (5, 11, 17, 23)),
    "vitdet_h": (1280, 32, 16, 0.5, (7, 15, 23, 31)),
}
MODELS = {
    "demo_vit_tiny": "configs/demo/mask_rcnn_vit_tiny.py",
    "vitdet_b": "configs/COCO/mask_rcnn_vitdet_b_100ep.py",
    "swin_b": "configs/COCO/mask_rcnn_swin_b_3x.py",
    "vitdet_l": "configs/COCO/mask_rcnn_vitdet_b_100ep.py",
    "vitdet_h": "configs/COCO/mask_rcnn_vitdet_b_100ep.py",
}
ALL = "vitdet_b,swin_b,vitdet_l,vitdet_h"


def load_config(name):
    """The model's lazy config, its arm set to "default"; returns ``(cfg, include patterns)``."""
    from detectron2.config import LazyConfig

    cfg = LazyConfig.load(os.path.join(ROOT, MODELS[name]))
    include = None
    if "condinit" in cfg:
        cfg.condinit.arm = "default"
        include = cfg.condinit.get("include", None)
        include = list(include) if include else None
    if name in VIT_SIZES:
        dim, depth, heads, drop_path, global_blocks = VIT_SIZES[name]
        net = cfg.model.backbone.net
        net.embed_dim, net.depth, net.num_heads, net.drop_path_rate = dim, depth, heads, drop_path
        net.window_block_indexes = [i for i in range(depth) if i not in global_blocks]
    return cfg, include


def _timed(fn, device="cpu"):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    if device != "cpu":
        torch.cuda.synchronize()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def measure_once(name, arms, device="cpu"):
    """One build of ``name`` and each arm once on it, in this process: a list of row dicts."""
    from detectron2.config import instantiate

    from condinit_det.init import apply_init

    cfg, include = load_config(name)
    torch.manual_seed(0)
    model, build_s, build_cpu = _timed(lambda: instantiate(cfg.model).to(device), device)
    params = sum(p.numel() for p in model.parameters())
    rows = []
    for arm in arms:
        report, arm_s, arm_cpu = _timed(lambda arm=arm: apply_init(model, arm, seed=0, include=include), device)
        rows.append(
            {
                "model": name,
                "params": params,
                "sites": len(report.sites),
                "arm": arm,
                "build_s": build_s,
                "build_cpu": build_cpu,
                "arm_s": arm_s,
                "arm_cpu": arm_cpu,
            }
        )
    return rows


def solver_change(name):
    """Mimetic on ``name`` by the "auto" route and by the dense SVD: seconds of each (and against the build, in
    this process) and how far the dense route moves the weights."""
    import copy

    from detectron2.config import instantiate

    from condinit_det.init import apply_init, find_attention, select_sites

    cfg, include = load_config(name)
    torch.manual_seed(0)
    built, build_s, _ = _timed(lambda: instantiate(cfg.model))
    models = {"auto": built, "dense": copy.deepcopy(built)}
    seconds = {}
    for solver, model in models.items():
        _, seconds[solver], _ = _timed(
            lambda model=model, solver=solver: apply_init(model, "mimetic", seed=0, include=include, solver=solver)
        )

    def relative(a, b):
        a, b = a.detach().double(), b.detach().double()
        return float(torch.linalg.matrix_norm(a - b) / torch.linalg.matrix_norm(b))

    weights, products = [], []
    sites = [select_sites(find_attention(m), include) for m in (models["dense"], models["auto"])]
    for dense, auto in zip(*sites):
        weights += [relative(dense.weight(role), auto.weight(role)) for role in ("q", "k", "v", "o")]
        dh = auto.head_dim
        for h in range(auto.num_heads):
            rows = slice(h * dh, (h + 1) * dh)
            products.append(relative(*(s.weight("q")[rows].T @ s.weight("k")[rows] for s in (dense, auto))))
    auto_s, dense_s = seconds["auto"], seconds["dense"]
    print(
        f"  {name} mimetic: auto {auto_s:.1f} s ({auto_s / build_s:.1f}x the {build_s:.2f} s build), "
        f"dense {dense_s:.1f} s ({dense_s / build_s:.1f}x); dense vs auto, relative Frobenius: "
        f"weights max {max(weights):.2g}, W_q^T W_k per head max {max(products):.2g} (median "
        f"{statistics.median(products):.2g}, {len(products)} heads)",
        flush=True,
    )


def measure(name, arms, repeats, threads=None, device="cpu"):
    """Table rows for ``name``: medians over ``repeats`` fresh processes (each: one build, every arm once)."""
    command = [sys.executable, os.path.abspath(__file__), "--one", name, "--arms", ",".join(arms), "--device", device]
    if threads:
        command += ["--threads", str(threads)]
    runs = []
    for _ in range(repeats):
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    rows = []
    for i, arm in enumerate(arms):
        med = {
            key: statistics.median(run[i][key] for run in runs) for key in ("build_s", "build_cpu", "arm_s", "arm_cpu")
        }
        first = runs[0][i]
        rows.append(
            [
                name,
                f"{first['params'] / 1e6:.1f}M",
                first["sites"],
                arm,
                f"{med['build_s']:.2f}",
                f"{med['arm_s']:.3f}",
                f"{100 * med['arm_s'] / med['build_s']:.1f}%",
                f"{med['build_cpu']:.2f}",
                f"{med['arm_cpu']:.3f}",
            ]
        )
        print(
            f"  {name} {arm}: {med['arm_s']:.3f} s ({100 * med['arm_s'] / med['build_s']:.1f}% of the "
            f"{med['build_s']:.2f} s build; medians of {repeats} processes)",
            flush=True,
        )
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=ALL, help=f"comma-separated, from: {', '.join(MODELS)}")
    parser.add_argument("--arms", default="default,conditioned,mimetic")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per model; medians are reported")
    parser.add_argument("--one", metavar="MODEL", help=argparse.SUPPRESS)  # one measurement, as JSON (internal)
    parser.add_argument(
        "--solvers",
        action="store_true",
        help="mimetic by the dense SVD vs the auto route: seconds and how far the weights move",
    )
    parser.add_argument("--quick", action="store_true", help="the tiny demo model only (for tests)")
    parser.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where the built model and the arms' factorizations are (default: cpu)",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available")
    names = ["demo_vit_tiny"] if args.quick else parse_names(parser, "--models", args.models, list(MODELS))
    if args.threads:
        torch.set_num_threads(args.threads)
    import condinit_det  # noqa: F401  (registers the project's modules)

    if args.one:
        print(json.dumps(measure_once(args.one, args.arms.split(","), args.device)))
        return None
    if args.solvers:
        for name in names:
            solver_change(name)
        return None
    print(format_machine_info(machine_info()))
    print(
        f"torch threads: {torch.get_num_threads()}; device: "
        f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}"
    )
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    rows = []
    for name in names:
        rows += measure(name, args.arms.split(","), 1 if args.quick else args.repeats, args.threads, args.device)
    print(
        format_table(
            ["model", "params", "sites", "arm", "build s", "arm s", "arm / build", "build CPU s", "arm CPU s"], rows
        )
    )
    print(f"load avg 1/5/15 min at the end: {load_average()}")
    return rows


if __name__ == "__main__":
    main()
