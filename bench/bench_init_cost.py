"""Cost of applying each arm, as a fraction of the time to build the model (CPU).

    python bench/bench_init_cost.py                      # ViTDet-B, Swin-B, ViTDet-L, ViTDet-H Mask R-CNN
    python bench/bench_init_cost.py --models vitdet_b    # a subset
    python bench/bench_init_cost.py --quick              # the tiny demo model only

Per model, in one run: "build" is ``instantiate(cfg.model)`` with the config's arm set to
"default" (detectron2 builds and initializes every layer; an armed model node then applies the
default arm, which changes nothing). Each arm is then timed as
``condinit_det.init.apply_init(model, arm, seed=0, include=cfg.condinit.include)`` on that built
model. The arms run one after the other on the same model: an arm overwrites every parameter it
targets and never reads them (mimetic keeps value rows beyond the rank, a copy), so its cost does
not depend on what an earlier arm left, and one build per model keeps ViTDet-H's minutes down.

Wall seconds are the headline; CPU seconds (all threads of this process) are printed beside them
because the machine may be shared. Targets: conditioned <= 10% of the build time, mimetic <= 1x.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import format_machine_info, format_table, machine_info  # noqa: E402

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


def _timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def measure(name, arms):
    from detectron2.config import instantiate

    from condinit_det.init import apply_init

    cfg, include = load_config(name)
    torch.manual_seed(0)
    model, build_s, build_cpu = _timed(lambda: instantiate(cfg.model))
    params = sum(p.numel() for p in model.parameters())
    rows = []
    for arm in arms:
        report, arm_s, arm_cpu = _timed(lambda: apply_init(model, arm, seed=0, include=include))
        rows.append([name, f"{params / 1e6:.1f}M", len(report.sites), arm, f"{build_s:.2f}",
                     f"{arm_s:.3f}", f"{100 * arm_s / build_s:.1f}%", f"{build_cpu:.2f}", f"{arm_cpu:.3f}"])
        print(f"  {name} {arm}: {arm_s:.3f} s ({100 * arm_s / build_s:.1f}% of the {build_s:.2f} s build)",
              flush=True)
    del model
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=ALL, help=f"comma-separated, from: {', '.join(MODELS)}")
    parser.add_argument("--arms", default="default,conditioned,mimetic")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    parser.add_argument("--quick", action="store_true", help="the tiny demo model only (for tests)")
    args = parser.parse_args(argv)
    names = ["demo_vit_tiny"] if args.quick else args.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    import condinit_det  # noqa: F401  (registers the project's modules)

    print(format_machine_info(machine_info()))
    print(f"torch threads: {torch.get_num_threads()}")
    rows = []
    for name in names:
        rows += measure(name, args.arms.split(","))
    print(format_table(["model", "params", "sites", "arm", "build s", "arm s", "arm / build", "build CPU s",
                        "arm CPU s"], rows))
    print(f"load avg 1/5/15 min at the end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return rows


if __name__ == "__main__":
    main()
