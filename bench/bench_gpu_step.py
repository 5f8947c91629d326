"""Training-step time and peak GPU memory of the paper's recipes, per arm, at the recipes' real size.

    python bench/bench_gpu_step.py --output step_bench.json                 # all four recipes, ~4 min
    python bench/bench_gpu_step.py --configs mask_rcnn_vitdet_b_100ep --arms default,conditioned
    python bench/bench_gpu_step.py --input-size typical --budget 600 --output step_bench_typical.json
    python bench/bench_gpu_step.py --tiny --device cpu --output /tmp/tiny.json   # smoke run (tests)

Recipes (``--configs``): ``RECIPES`` below, the ViTDet-B, Swin-B and XCiT-S12 Mask R-CNN COCO configs and the
XCiT-S12 ImageNet pretraining config. One step is the stage's own training step: detectron2's
``AMPTrainer.run_step`` (``SimpleTrainer`` where the config or a CPU has no AMP) with the config's optimizer, or
the pretraining stage's ``PretrainStep`` (Mixup/CutMix, AMP, ``NativeScaler``, scheduler, EMA) on the classifier
of ``build_armed_model``; it is timed from a CUDA synchronize to the next one.

Batch: the config's total batch over the GPUs of its published recipe (``recipe_gpus``), in one process on one
GPU: no all-reduce, no data loading. Inputs are synthetic and fixed, the same batches for every arm in the same
order: random images; for detection 7 objects per image (COCO's mean), each a random box of 5-50% of the side
with a 16-vertex elliptic polygon mask. ``--input-size largest`` (default) is the recipe's largest training
input (LSJ 1024 x 1024, multi-scale 800 x 1333, 224 x 224): worst-case memory, an upper bound of the step;
``typical`` is the multi-scale mean shorter side at 4:3, 640 x 853.

Arms: every arm of ``condinit_det.init.ARMS`` (``--arms``; the default arm is always measured and ratios are to
it). An arm only rewrites weights at construction, so the ratios should be 1.00 within noise. After
``--warmup`` untimed steps per arm, interleaved rounds (each starting one arm later) of ``--steps`` timed
steps; per arm the median and minimum step, the ratio of medians and the paired ratio (median over rounds of
the round-time ratio). Peak memory (CUDA only): ``max_memory_allocated`` from the arm's build through its
warmup, less what the arms built before hold; every arm of a recipe stays on the GPU at once.

Budget: ``--budget`` seconds in all; each recipe gets an equal share of what is left, rounds run until it is
spent (``--min-rounds`` to ``--max-rounds``). A failing recipe (e.g. out of memory) is recorded with its error,
the others still run, the exit status is 1; the JSON is rewritten after every recipe. ``--tiny`` shrinks
every recipe for a CPU smoke run: its numbers say nothing about the recipes.

Output: a table; with ``--output PATH`` a JSON file (format ``condinit_det.step_bench/1``, read by
``condinit_det.launch.plan.load_step_times`` for the launcher's ``--dry-run``): ``{"format", "device",
"torch", "machine", "tiny", "input_size", "budget_s", "warmup", "seed", "configs": {<config path>: {"name",
"stage", "recipe_gpus", "total_batch", "batch_per_gpu", "image_size", "amp", "error", "tiny_overrides",
"instances_per_image" or "imagenet_steps_per_epoch", "arms": {<arm>: {"median_step_s", "min_step_s",
"timed_steps", "rounds", "peak_memory_bytes", "ratio_to_default", "paired_ratio_to_default", "sites",
"params_changed", "parameters"}}}}, "elapsed_s"}``; a failed recipe has ``"error"`` set and no arms.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from condinit_det.launch.plan import STEP_BENCH_FORMAT

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/common.py, however invoked
from common import (  # noqa: E402
    check_at_least,
    device_info,
    format_device_info,
    format_machine_info,
    format_table,
    machine_info,
    median,
    paired_ratio,
    parse_names,
    timed_round,
)
from synthetic_coco import INSTANCES_PER_IMAGE, POLYGON_VERTICES, detection_batches  # noqa: E402, F401  (re-exported)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMAT = STEP_BENCH_FORMAT  # what condinit_det.launch.plan.load_step_times reads
DEFAULT_ARM = "default"
INPUT_SIZES = ("largest", "typical")
IMAGENET_TRAIN_IMAGES = 1281167  # ImageNet-1k training set
TINY_HEAD_WIDTH = 32  # feature pyramid and RPN channels at --tiny; box/mask head layers are narrower still


@dataclass(frozen=True)
class Recipe:
    """One benchmarked config and the facts about its recipe that the config does not hold.

    ``recipe_gpus``: GPUs of the published recipe (per-GPU batch = the config's total batch / this).
    Sizes are (height, width) of a training input. ``tiny_overrides``: ``key=value`` overrides of the
    trunk at ``--tiny`` (the heads are narrowed for every detection config alike).
    """

    name: str
    path: str
    stage: str  # "detection" or "pretrain"
    recipe_gpus: int
    largest_size: Tuple[int, int]
    typical_size: Tuple[int, int]
    tiny_size: Tuple[int, int]
    tiny_overrides: Tuple[str, ...] = ()

    def size(self, rule: str, tiny: bool) -> Tuple[int, int]:
        if tiny:
            return self.tiny_size
        return self.largest_size if rule == "largest" else self.typical_size


# recipe_gpus: ViTDet 64 images on 64 GPUs (detectron2's projects/ViTDet README), Swin and XCiT Mask R-CNN 16 on 8
# (their detection recipes), XCiT ImageNet 1024 on 8 (the XCiT README's command).
RECIPES: Dict[str, Recipe] = {
    r.name: r
    for r in (
        Recipe(
            "mask_rcnn_vitdet_b_100ep",
            "configs/COCO/mask_rcnn_vitdet_b_100ep.py",
            "detection",
            recipe_gpus=64,
            largest_size=(1024, 1024),
            typical_size=(1024, 1024),
            tiny_size=(128, 128),
            tiny_overrides=(
                "model.backbone.net.img_size=128",
                "model.backbone.square_pad=128",
                "model.backbone.net.embed_dim=32",
                "model.backbone.net.depth=2",
                "model.backbone.net.num_heads=2",
                "model.backbone.net.window_size=4",
                "model.backbone.net.window_block_indexes=[0]",
            ),
        ),
        Recipe(
            "mask_rcnn_swin_b_3x",
            "configs/COCO/mask_rcnn_swin_b_3x.py",
            "detection",
            recipe_gpus=8,
            largest_size=(800, 1333),
            typical_size=(640, 853),
            tiny_size=(96, 128),
            tiny_overrides=(
                "model.backbone.bottom_up.embed_dim=16",
                "model.backbone.bottom_up.depths=[1,1,1,1]",
                "model.backbone.bottom_up.num_heads=[1,1,2,2]",
                "model.backbone.bottom_up.window_size=4",
            ),
        ),
        Recipe(
            "mask_rcnn_xcit_s12_3x",
            "configs/COCO/mask_rcnn_xcit_s12_3x.py",
            "detection",
            recipe_gpus=8,
            largest_size=(800, 1333),
            typical_size=(640, 853),
            tiny_size=(96, 128),
            tiny_overrides=(
                "model.backbone.net.embed_dim=32",
                "model.backbone.net.depth=2",
                "model.backbone.net.num_heads=2",
            ),
        ),
        Recipe(
            "xcit_s12_p16_400ep",
            "configs/ImageNet/xcit_s12_p16_400ep.py",
            "pretrain",
            recipe_gpus=8,
            largest_size=(224, 224),
            typical_size=(224, 224),
            tiny_size=(64, 64),
            tiny_overrides=(
                "model.kwargs.img_size=64",
                "model.kwargs.embed_dim=32",
                "model.kwargs.depth=2",
                "model.kwargs.num_heads=2",
                "data.num_classes=10",
            ),
        ),
    )
}
TINY_BATCH = {"detection": 1, "pretrain": 2}  # Mixup pairs the images of a batch: at least 2


def tiny_head_overrides(cfg) -> List[str]:
    """Overrides narrowing the feature pyramid, RPN and ROI heads of a Mask R-CNN config for a CPU (same
    layer counts, TINY_HEAD_WIDTH channels, few proposals and sampled ROIs)."""
    width, roi = TINY_HEAD_WIDTH, cfg.model.roi_heads
    box_convs, box_fcs = len(roi.box_head.conv_dims), len(roi.box_head.fc_dims)
    return [
        f"model.backbone.out_channels={width}",
        f"model.proposal_generator.head.in_channels={width}",
        "model.proposal_generator.pre_nms_topk=[200,100]",
        "model.proposal_generator.post_nms_topk=[50,50]",
        "model.roi_heads.batch_size_per_image=32",
        f"model.roi_heads.box_head.input_shape.channels={width}",
        f"model.roi_heads.box_head.conv_dims=[{','.join(['16'] * box_convs)}]",
        f"model.roi_heads.box_head.fc_dims=[{','.join(['32'] * box_fcs)}]",
        f"model.roi_heads.box_predictor.input_shape.channels={32 if box_fcs else 16}",
        f"model.roi_heads.mask_head.input_shape.channels={width}",
        "model.roi_heads.mask_head.conv_dims=[16,16]",
    ]


def classification_batches(
    *, num: int, batch: int, size: Tuple[int, int], num_classes: int, seed: int, pin: bool
) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """``num`` (images [batch, 3, h, w] float32 ~ N(0, 1), labels [batch] int64) pairs, as a normalizing
    loader gives them (pinned for a CUDA device, like the pretraining loader's)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(num):
        images = torch.randn((batch, 3, *size), generator=g)
        labels = torch.randint(0, num_classes, (batch,), generator=g)
        out.append((images.pin_memory(), labels.pin_memory()) if pin else (images, labels))
    return out


# ---------------------------------------------------------------------------------------------
# One arm's model and training step
# ---------------------------------------------------------------------------------------------
class Variant:
    """One arm: model, optimizer and the stage's training step; ``times`` / ``round_times`` in seconds."""

    def __init__(self, arm: str, device: torch.device):
        self.arm = arm
        self.device = device
        self.report = None
        self.parameters = 0
        self.peak_memory: Optional[int] = None
        self.times: List[float] = []
        self.round_times: List[float] = []

    def run_step(self) -> None:
        raise NotImplementedError

    def step(self) -> float:
        """One training step, timed from a synchronized device to a synchronized device; seconds."""
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        self.run_step()
        if cuda:
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - start


class DetectionVariant(Variant):
    """``instantiate(cfg.model)`` with the arm set in ``cfg.condinit``, trained by detectron2's trainer."""

    def __init__(self, cfg, *, arm: str, seed: int, device: torch.device, batches: Sequence[list], amp: bool):
        from detectron2.config import instantiate
        from detectron2.engine import AMPTrainer, SimpleTrainer
        from detectron2.utils.env import seed_all_rng
        from detectron2.utils.events import EventStorage

        super().__init__(arm, device)
        cfg.condinit.arm, cfg.condinit.seed = arm, seed
        # Same global RNG state before every build: the arms differ only in the weights they rewrite.
        seed_all_rng(seed)
        model = instantiate(cfg.model)
        self.report = getattr(model, "condinit_report", None)
        self.parameters = sum(p.numel() for p in model.parameters())
        model.to(device)
        model.train()
        cfg.optimizer.params.model = model
        optimizer = instantiate(cfg.optimizer)
        loader = itertools.cycle(batches)  # every arm sees the same batches in the same order
        self.trainer = AMPTrainer(model, loader, optimizer) if amp else SimpleTrainer(model, loader, optimizer)
        # The trainer's metric writing reads the current EventStorage.
        self.storage = EventStorage(0)

    def run_step(self) -> None:
        with self.storage:
            self.storage.iter = self.trainer.iter
            self.trainer.run_step()
            self.trainer.iter += 1


class PretrainVariant(Variant):
    """The armed timm classifier with the recipe's optimizer, scheduler, Mixup, loss, loss scaling and EMA; its
    step is the pretraining stage's own (:class:`condinit_det.pretrain.step.PretrainStep`) on one batch."""

    def __init__(self, cfg, *, arm: str, seed: int, device: torch.device, batches: Sequence[tuple], amp: bool):
        from detectron2.utils.env import seed_all_rng

        from condinit_det.pretrain import build_armed_model, node
        from condinit_det.pretrain.config import arm_spec
        from condinit_det.pretrain.step import PretrainStep

        super().__init__(arm, device)
        cfg.condinit.arm, cfg.condinit.seed = arm, seed
        nodes = {name: node(cfg, name) for name in ("model", "data", "augment", "optimizer", "scheduler", "train")}
        data, train = nodes["data"], nodes["train"]
        # Same global RNG state before every build: the arms differ only in the weights they rewrite.
        seed_all_rng(seed)
        self.model, self.report = build_armed_model(nodes["model"], int(data["num_classes"]), arm_spec(cfg, seed))
        self.parameters = sum(p.numel() for p in self.model.parameters())
        self.model.to(device)
        self.model.train()
        dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16}
        if train["amp_dtype"] not in dtypes:
            raise ValueError(f"train.amp_dtype={train['amp_dtype']!r}; accepted: {', '.join(dtypes)}")
        self.pretrain_step = PretrainStep(
            self.model,
            nodes,
            num_classes=int(data["num_classes"]),
            amp_dtype=dtypes[train["amp_dtype"]] if amp else None,
            steps_per_epoch=max(IMAGENET_TRAIN_IMAGES // int(train["batch_size"]), 1),
        )
        self.batches = itertools.cycle(batches)  # every arm sees the same batches in the same order
        self.steps_done = 0

    def run_step(self) -> None:
        images, labels = next(self.batches)
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        if self.device.type == "cpu":  # Mixup mixes in place, and on the CPU .to() did not copy
            images = images.clone()
        self.steps_done += 1
        self.pretrain_step(self.model, images, labels, step=self.steps_done)


# ---------------------------------------------------------------------------------------------
# One recipe: build the arms, warm up, interleaved rounds
# ---------------------------------------------------------------------------------------------
def load_recipe_config(recipe: Recipe, *, tiny: bool):
    """The recipe's lazy config; with ``tiny`` the trunk's and (detection) the heads' overrides applied.
    Returns (cfg, overrides applied)."""
    from detectron2.config import LazyConfig

    cfg = LazyConfig.load(os.path.join(ROOT, recipe.path))
    overrides = list(recipe.tiny_overrides) if tiny else []
    if tiny and recipe.stage == "detection":
        overrides += tiny_head_overrides(cfg)
    return LazyConfig.apply_overrides(cfg, overrides), overrides


def recipe_batch(recipe: Recipe, cfg) -> Tuple[int, int]:
    """(the config's total batch, the recipe's per-GPU batch)."""
    from condinit_det.pretrain import node

    if recipe.stage == "detection":
        total = int(cfg.dataloader.train.total_batch_size)
    else:
        total = int(node(cfg, "train")["batch_size"])
    if total % recipe.recipe_gpus:
        raise ValueError(
            f"{recipe.path}: total batch {total} does not split over the recipe's {recipe.recipe_gpus} GPUs"
        )
    return total, total // recipe.recipe_gpus


def recipe_amp(recipe: Recipe, cfg, device: torch.device) -> bool:
    """AMP as the recipe trains (its config's flag), on CUDA only (detectron2's AMPTrainer needs CUDA)."""
    from condinit_det.pretrain import node

    enabled = bool(cfg.train.amp.enabled) if recipe.stage == "detection" else bool(node(cfg, "train")["amp"])
    return enabled and device.type == "cuda"


def measure_recipe(
    recipe: Recipe,
    *,
    arms: Sequence[str],
    device: torch.device,
    tiny: bool,
    input_size: str,
    seed: int,
    warmup: int,
    steps: int,
    min_rounds: int,
    max_rounds: int,
    num_batches: int,
    deadline: float,
    log=print,
) -> dict:
    """Build every arm, warm each up, then time interleaved rounds until ``deadline`` (``time.perf_counter``
    seconds; at least ``min_rounds``, at most ``max_rounds``). Returns the recipe's JSON entry."""
    from condinit_det.pretrain import node

    cfg, overrides = load_recipe_config(recipe, tiny=tiny)
    total_batch, batch_per_gpu = recipe_batch(recipe, cfg)
    if tiny:
        batch_per_gpu = TINY_BATCH[recipe.stage]
    size = recipe.size(input_size, tiny)
    amp = recipe_amp(recipe, cfg, device)
    if recipe.stage == "detection":
        batches = detection_batches(
            num=num_batches, batch=batch_per_gpu, size=size, num_classes=int(cfg.model.roi_heads.num_classes), seed=seed
        )
    else:
        batches = classification_batches(
            num=num_batches,
            batch=batch_per_gpu,
            size=size,
            num_classes=int(node(cfg, "data")["num_classes"]),
            seed=seed,
            pin=device.type == "cuda",
        )
    log(
        f"[{recipe.name}] batch {batch_per_gpu} per GPU, {size[0]}x{size[1]} px, AMP {'on' if amp else 'off'}"
        + (f"; tiny overrides: {' '.join(overrides)}" if overrides else ""),
        flush=True,
    )

    cuda = device.type == "cuda"
    variant_class = DetectionVariant if recipe.stage == "detection" else PretrainVariant
    variants: List[Variant] = []
    for arm in arms:
        if cuda:
            torch.cuda.synchronize(device)
            held_before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        v = variant_class(cfg, arm=arm, seed=seed, device=device, batches=batches, amp=amp)
        for _ in range(warmup):
            v.step()
        if cuda:
            torch.cuda.synchronize(device)
            v.peak_memory = int(torch.cuda.max_memory_allocated(device) - held_before)
        variants.append(v)
        log(f"[{recipe.name}] {arm}: built, {warmup} warmup step(s)", flush=True)

    rounds = 0
    while rounds < max_rounds:
        started = time.perf_counter()
        last_round = sum(v.round_times[-1] for v in variants) if rounds else 0.0
        if rounds >= min_rounds and started + last_round > deadline:
            break
        timed_round(variants, rounds, steps)
        rounds += 1
    log(f"[{recipe.name}] {rounds} round(s) of {steps} timed step(s) per arm", flush=True)
    return recipe_entry(
        recipe,
        variants,
        total_batch=total_batch,
        batch_per_gpu=batch_per_gpu,
        size=size,
        amp=amp,
        rounds=rounds,
        overrides=overrides,
    )


def recipe_entry(
    recipe: Recipe,
    variants: Sequence[Variant],
    *,
    total_batch: int,
    batch_per_gpu: int,
    size: Tuple[int, int],
    amp: bool,
    rounds: int,
    overrides: Sequence[str],
) -> dict:
    base = next(v for v in variants if v.arm == DEFAULT_ARM)
    base_median = median(base.times)
    arms = {}
    for v in variants:
        med = median(v.times)
        arms[v.arm] = {
            "median_step_s": med,
            "min_step_s": min(v.times),
            "timed_steps": len(v.times),
            "rounds": rounds,
            "peak_memory_bytes": v.peak_memory,
            "ratio_to_default": med / base_median,
            "paired_ratio_to_default": paired_ratio(v.round_times, base.round_times),
            "sites": len(v.report.sites) if v.report is not None else None,
            "params_changed": len(v.report.changed_parameters()) if v.report is not None else None,
            "parameters": v.parameters,
        }
    entry = {
        "name": recipe.name,
        "stage": recipe.stage,
        "recipe_gpus": recipe.recipe_gpus,
        "total_batch": total_batch,
        "batch_per_gpu": batch_per_gpu,
        "image_size": list(size),
        "amp": amp,
        "error": None,
        "arms": arms,
        "tiny_overrides": list(overrides),
    }
    if recipe.stage == "detection":
        entry["instances_per_image"] = INSTANCES_PER_IMAGE
    else:
        entry["imagenet_steps_per_epoch"] = IMAGENET_TRAIN_IMAGES // total_batch
    return entry


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------
def format_results(configs: Dict[str, dict]) -> str:
    rows, failures = [], []
    for entry in configs.values():
        if entry["error"] is not None:
            failures.append(f"FAILED: {entry['name']}: {entry['error']}")
            continue
        h, w = entry["image_size"]
        for arm, r in entry["arms"].items():
            mem = "-" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / 2**30:.2f}"
            rows.append(
                [
                    entry["name"],
                    arm,
                    entry["batch_per_gpu"],
                    f"{h}x{w}",
                    f"{r['median_step_s']:.4f}",
                    f"{r['min_step_s']:.4f}",
                    f"{r['ratio_to_default']:.3f}",
                    f"{r['paired_ratio_to_default']:.3f}",
                    mem,
                    r["timed_steps"],
                ]
            )
    table = (
        format_table(
            [
                "config",
                "arm",
                "batch/GPU",
                "input",
                "median s/step",
                "min s/step",
                "median / default",
                "paired / default",
                "peak GiB",
                "timed steps",
            ],
            rows,
        )
        if rows
        else "(no recipe measured)"
    )
    return "\n".join([table, *failures])


def format_epoch_lines(configs: Dict[str, dict]) -> List[str]:
    lines = []
    for entry in configs.values():
        if entry["error"] is None and "imagenet_steps_per_epoch" in entry:
            steps = entry["imagenet_steps_per_epoch"]
            seconds = steps * entry["arms"][DEFAULT_ARM]["median_step_s"]
            lines.append(
                f"{entry['name']}: an ImageNet-1k epoch is {steps} steps of {entry['total_batch']} images "
                f"({entry['recipe_gpus']} GPUs): {seconds / 3600:.2f} h at the default arm's median step"
            )
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--configs", default=",".join(RECIPES), help=f"comma-separated recipes (default: all): {', '.join(RECIPES)}"
    )
    parser.add_argument(
        "--arms",
        default=None,
        help="comma-separated arms (default: every arm of condinit_det.init.ARMS; the default arm is always measured)",
    )
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (cpu needs --tiny)")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes for a CPU smoke run (numbers meaningless)")
    parser.add_argument(
        "--input-size",
        default="largest",
        choices=INPUT_SIZES,
        help="largest (default): each recipe's largest training input; typical: the multi-scale "
        "recipes' mean shorter side at 4:3",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=240.0,
        metavar="SECONDS",
        help="overall time budget of the measurement (default 240)",
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per arm (default 3; >= 1)")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per arm per round (default 1)")
    parser.add_argument("--min-rounds", type=int, default=3, help="rounds run even past the budget (default 3)")
    parser.add_argument("--max-rounds", type=int, default=30, help="rounds at most (default 30)")
    parser.add_argument(
        "--num-batches", type=int, default=2, help="distinct synthetic batches, cycled through by every arm (default 2)"
    )
    parser.add_argument("--seed", type=int, default=0, help="model, arm and input seed (default 0)")
    parser.add_argument("--output", metavar="PATH", help="write the results as JSON to PATH")
    return parser


def main(argv=None) -> int:
    from condinit_det.init import ARMS
    from condinit_det.utils.fileio import atomic_write

    parser = build_parser()
    args = parser.parse_args(argv)
    started = time.perf_counter()
    names = parse_names(parser, "--configs", args.configs, list(RECIPES))
    arms = parse_names(parser, "--arms", args.arms, list(ARMS)) if args.arms is not None else list(ARMS)
    if DEFAULT_ARM not in arms:
        arms.insert(0, DEFAULT_ARM)  # the ratios are to it
    check_at_least(parser, args, dict(warmup=1, steps=1, min_rounds=1, max_rounds=1, num_batches=1))
    if args.max_rounds < args.min_rounds:
        parser.error(f"--max-rounds ({args.max_rounds}) must be >= --min-rounds ({args.min_rounds})")
    if not (args.budget > 0 and math.isfinite(args.budget)):
        parser.error(f"--budget must be a positive number of seconds, got {args.budget}")
    if args.output and not os.path.isdir(os.path.dirname(os.path.abspath(args.output))):
        parser.error(f"--output {args.output}: its folder does not exist")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device {args.device!r}; accepted: cuda, cuda:N, cpu")
    if device.type not in ("cuda", "cpu"):
        parser.error(f"--device {args.device!r}; accepted: cuda, cuda:N, cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available (a CPU smoke run: --device cpu --tiny)")
    if device.type == "cpu" and not args.tiny:
        parser.error("--device cpu needs --tiny: a real-size step takes minutes on a CPU")
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device.index >= torch.cuda.device_count():
            parser.error(f"--device {args.device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        torch.cuda.set_device(device)

    import condinit_det  # noqa: F401  (registers the project's modules)

    info = device_info(str(device))
    machine = machine_info(packages=("numpy", "torch", "timm", "detectron2"))
    print(format_machine_info(machine))
    print(format_device_info(info))
    print(
        f"recipes: {', '.join(names)}; arms: {', '.join(arms)}; input size: {args.input_size}"
        f"{' (tiny)' if args.tiny else ''}; budget {args.budget:g} s",
        flush=True,
    )
    payload = {
        "format": FORMAT,
        "device": info,
        "torch": torch.__version__,
        "machine": machine,
        "tiny": args.tiny,
        "input_size": args.input_size,
        "budget_s": args.budget,
        "warmup": args.warmup,
        "seed": args.seed,
        "configs": {},
    }
    deadline = started + args.budget
    failed = False
    for i, name in enumerate(names):
        recipe = RECIPES[name]
        now = time.perf_counter()
        share_end = now + max(deadline - now, 0.0) / (len(names) - i)
        try:
            entry = measure_recipe(
                recipe,
                arms=arms,
                device=device,
                tiny=args.tiny,
                input_size=args.input_size,
                seed=args.seed,
                warmup=args.warmup,
                steps=args.steps,
                min_rounds=args.min_rounds,
                max_rounds=args.max_rounds,
                num_batches=args.num_batches,
                deadline=share_end,
            )
        except Exception as e:  # one recipe failing (e.g. out of memory) must not lose the others' numbers
            traceback.print_exc()
            failed = True
            message = str(e).strip().splitlines()[0] if str(e).strip() else ""
            entry = {"name": recipe.name, "stage": recipe.stage, "error": f"{type(e).__name__}: {message}", "arms": {}}
        payload["configs"][recipe.path] = entry
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if args.output:
            atomic_write(args.output, json.dumps(payload, indent=2) + "\n")
    payload["elapsed_s"] = time.perf_counter() - started
    if args.output:
        atomic_write(args.output, json.dumps(payload, indent=2) + "\n")
    print()
    print(format_results(payload["configs"]))
    for line in format_epoch_lines(payload["configs"]):
        print(line)
    if args.output:
        print(f"\nwritten: {args.output}")
    print(f"elapsed: {payload['elapsed_s']:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
