"""Cost of applying each arm, as a fraction of the time to build the model (CPU).

    python bench/bench_init_cost.py                      # ViTDet-B/L/H and Swin-B Mask R-CNN
    python bench/bench_init_cost.py --models vitdet_b    # a subset
    python bench/bench_init_cost.py --quick              # the tiny demo model only

Both times are measured in the same run: ``instantiate(cfg.model)`` (detectron2 builds and
initializes every layer) and ``apply_arm_config`` with the config's own include patterns.
The target is an arm cost under 5% of the build time.
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
    "vitdet_l": "configs/COCO/mask_rcnn_vitdet_b_100ep.py",
    "vitdet_h": "configs/COCO/mask_rcnn_vitdet_b_100ep.py",
    "swin_b": "configs/COCO/mask_rcnn_swin_b_3x.py",
}


def load_config(name):
    from detectron2.config import LazyConfig

    cfg = LazyConfig.load(os.path.join(ROOT, MODELS[name]))
    if name in VIT_SIZES:
        dim, depth, heads, drop_path, global_blocks = VIT_SIZES[name]
        net = cfg.model.backbone.net
        net.embed_dim, net.depth, net.num_heads, net.drop_path_rate = dim, depth, heads, drop_path
        net.window_block_indexes = [i for i in range(depth) if i not in global_blocks]
    return cfg


def measure(name, arms):
    from detectron2.config import instantiate

    from condinit_det.modeling import apply_arm_config

    cfg = load_config(name)
    torch.manual_seed(0)
    start = time.perf_counter()
    model = instantiate(cfg.model)
    build_s = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    rows = []
    for arm in arms:
        node = dict(cfg.condinit)
        node["arm"] = arm
        start = time.perf_counter()
        report = apply_arm_config(model, node)
        arm_s = time.perf_counter() - start
        rows.append([name, f"{params / 1e6:.1f}M", len(report.sites), arm, f"{build_s:.2f}", f"{arm_s:.3f}",
                     f"{100 * arm_s / build_s:.1f}%"])
    del model
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="vitdet_b,vitdet_l,vitdet_h,swin_b",
                        help=f"comma-separated, from: {', '.join(MODELS)}")
    parser.add_argument("--arms", default="default,conditioned,mimetic")
    parser.add_argument("--quick", action="store_true", help="the tiny demo model only (for tests)")
    args = parser.parse_args(argv)
    names = ["demo_vit_tiny"] if args.quick else args.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    import condinit_det  # noqa: F401  (registers the project's modules)

    print(format_machine_info(machine_info()))
    print(f"torch threads: {torch.get_num_threads()}")
    rows = []
    for name in names:
        rows += measure(name, args.arms.split(","))
        print(f"measured {name}", flush=True)
    print(format_table(["model", "params", "sites", "arm", "build s", "arm s", "arm / build"], rows))
    return rows


if __name__ == "__main__":
    main()
