"""Training-step time with each arm applied, against the same model with no arm code at all.

    python bench/bench_train_step.py                                   # tiny ViTDet demo config
    python bench/bench_train_step.py --config-file configs/demo/mask_rcnn_swin_tiny.py
    python bench/bench_train_step.py --rounds 20 --steps 1 --opts train.device=cuda
    python bench/bench_train_step.py --quick                           # smoke run (tests)

An arm only rewrites weights at construction, so a step must cost the same with or without it (ratio 1.00
within noise). Variants: ``baseline`` (the model node's own target: no arm code at all) and one per arm (the
armed node with ``condinit.arm`` set). Every model is built from the same global RNG state, so all start from the
baseline's weights outside the projections the arm reports changing (checked: exit status 1 otherwise), and all
train on the same batches taken once from ``cfg.dataloader.train``, each with its own ``cfg.optimizer``.

A step is ``SimpleTrainer.run_step`` without metric writing (forward, loss sum, ``zero_grad``, backward,
``optimizer.step()``). After the warmup, interleaved rounds (each starting one variant later); per variant the
median and minimum step, their ratios to the baseline's, and the paired ratio (median over rounds of the
round-time ratio, least affected by slow drifts of the machine's load).
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/common.py, however invoked
from common import (  # noqa: E402
    check_at_least,
    format_machine_info,
    format_table,
    machine_info,
    median,
    paired_ratio,
    parse_names,
    timed_round,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIG = "configs/demo/mask_rcnn_vit_tiny.py"
BASELINE = "baseline"
QUICK_BATCH = 2  # images per batch in --quick mode
OK_LINE = "OK: every variant starts from the baseline's weights outside the arm's projections"


def load_config(path, opts):
    from detectron2.config import LazyConfig

    full = path if os.path.isabs(path) else os.path.join(ROOT, path)
    if not os.path.isfile(full):
        raise SystemExit(f"bench_train_step: config file {path} does not exist.")
    if not full.endswith(".py"):
        raise SystemExit(f"bench_train_step: {path} is not a lazy (.py) config; only those are accepted.")
    cfg = LazyConfig.load(full)
    cfg = LazyConfig.apply_overrides(cfg, list(opts))
    missing = [k for k in ("model", "optimizer", "dataloader") if k not in cfg]
    if not missing and "train" not in cfg.dataloader:
        missing.append("dataloader.train")
    if missing:
        raise SystemExit(
            f"bench_train_step: {path} lacks {', '.join(missing)}; a training config "
            "with model, optimizer and dataloader.train is needed."
        )
    return cfg


def unarmed(node):
    """A copy of an armed model node that builds the bare model: its original ``_arm_target_`` back as
    ``_target_``, without ``condinit`` and the other ``_arm_*`` keys (interpolations stay unresolved)."""
    from omegaconf import OmegaConf

    plain = OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else dict(node)
    plain["_target_"] = plain.pop("_arm_target_")
    bare = {key: value for key, value in plain.items() if key != "condinit" and not key.startswith("_arm_")}
    return OmegaConf.create(bare, flags={"allow_objects": True})


def model_node(cfg, arm, seed):
    """The model node that builds ``arm`` (seed ``seed``), or for ``arm`` None the bare model without arm code."""
    from condinit_det.modeling.arm import is_armed

    if arm is not None:
        cfg.condinit.arm, cfg.condinit.seed = arm, seed
        return cfg.model
    return unarmed(cfg.model) if is_armed(cfg.model) else cfg.model


def take_batches(cfg, num, seed):
    """``num`` batches from the config's training loader, taken once (data order fixed by ``seed``)."""
    from detectron2.config import instantiate
    from detectron2.utils.env import seed_all_rng

    seed_all_rng(seed)
    loader = instantiate(cfg.dataloader.train)
    it = iter(loader)
    batches = [next(it) for _ in range(num)]
    del it, loader
    return batches


class Variant:
    """One model + optimizer; ``arm`` None is the baseline (no arm code called)."""

    def __init__(self, cfg, name, arm, seed, batches):
        from detectron2.config import instantiate
        from detectron2.utils.env import seed_all_rng
        from detectron2.utils.events import EventStorage

        self.name = name
        # Same global RNG state before every build: identical construction-time weights.
        seed_all_rng(seed)
        self.model = instantiate(model_node(cfg, arm, seed))
        self.report = getattr(self.model, "condinit_report", None) if arm is not None else None
        self.model.to(cfg.train.device)
        self.model.train()
        cfg.optimizer.params.model = self.model
        self.optimizer = instantiate(cfg.optimizer)
        self.cuda = str(cfg.train.device).startswith("cuda")
        # Detectron2 models log training statistics into the current EventStorage.
        self.storage = EventStorage(0)
        self.batches = batches
        self.times = []  # every timed step, seconds
        self.round_times = []  # total of the timed steps of each round, seconds
        self.steps_done = 0

    def step(self):
        """One training step on the next batch; its seconds."""
        batch = self.batches[self.steps_done % len(self.batches)]
        self.steps_done += 1
        if self.cuda:
            torch.cuda.synchronize()
        with self.storage:
            self.storage.iter = self.steps_done
            start = time.perf_counter()
            loss_dict = self.model(batch)
            losses = loss_dict if isinstance(loss_dict, torch.Tensor) else sum(loss_dict.values())
            self.optimizer.zero_grad()
            losses.backward()
            self.optimizer.step()
            if self.cuda:
                torch.cuda.synchronize()
            return time.perf_counter() - start


def check_same_start(baseline, variants):
    """
    Names of tensors (parameters and buffers) that differ from the baseline although the arm did
    not report changing them, per variant. Empty lists everywhere mean a fair comparison.
    """
    ref = baseline.model.state_dict()
    bad = {}
    for v in variants:
        changed = set(v.report.changed_parameters()) if v.report is not None else set()
        state = v.model.state_dict()
        if state.keys() != ref.keys():
            bad[v.name] = sorted(set(state) ^ set(ref))
            continue
        bad[v.name] = [k for k, t in state.items() if k not in changed and not torch.equal(t, ref[k])]
    return bad


def run(cfg, *, arms, warmup, rounds, steps, num_batches, seed, log=print):
    """Build the variants, warm up, time interleaved rounds; returns (variants, mismatches)."""
    batches = take_batches(cfg, num_batches, seed)
    log(f"took {len(batches)} batches of {len(batches[0])} image(s) from cfg.dataloader.train")
    variants = [Variant(cfg, BASELINE, None, seed, batches)]
    variants += [Variant(cfg, arm, arm, seed, batches) for arm in arms]
    mismatches = check_same_start(variants[0], variants[1:])
    for v in variants:
        for _ in range(warmup):
            v.step()
    log(f"warmup done ({warmup} step(s) per variant)")
    for r in range(rounds):
        timed_round(variants, r, steps)
        log(f"round {r + 1}/{rounds} done", flush=True)
    return variants, mismatches


def format_results(variants):
    base = variants[0]
    base_med, base_min = median(base.times), min(base.times)
    rows = []
    for v in variants:
        sites = "-" if v.report is None else len(v.report.sites)
        params = "-" if v.report is None else len(v.report.changed_parameters())
        med, lo = median(v.times), min(v.times)
        paired = paired_ratio(v.round_times, base.round_times)
        rows.append(
            [
                v.name,
                sites,
                params,
                len(v.times),
                f"{med:.3f}",
                f"{lo:.3f}",
                f"{med / base_med:.3f}",
                f"{lo / base_min:.3f}",
                f"{paired:.3f}",
            ]
        )
    return format_table(
        [
            "variant",
            "sites",
            "params changed",
            "timed steps",
            "median s/step",
            "min s/step",
            "median / baseline",
            "min / baseline",
            "paired / baseline",
        ],
        rows,
    )


def main(argv=None):
    from condinit_det.init import ARMS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--config-file",
        default=DEFAULT_CONFIG,
        metavar="FILE",
        help=f"lazy training config (default: {DEFAULT_CONFIG})",
    )
    parser.add_argument(
        "--arms",
        default=",".join(ARMS),
        help=f"comma-separated arms to compare with the baseline, from: {', '.join(ARMS)}",
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant (default 3)")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (default 10)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per variant per round (default 2)")
    parser.add_argument(
        "--num-batches", type=int, default=4, help="distinct batches, cycled through by every variant (default 4)"
    )
    parser.add_argument("--seed", type=int, default=0, help="model, data-order and arm seed (default 0)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"1 warmup step, 1 round of 2 timed steps, 2 batches of {QUICK_BATCH} images (for tests)",
    )
    parser.add_argument(
        "--opts",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides, e.g. train.device=cuda dataloader.train.total_batch_size=2",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.warmup, args.rounds, args.steps, args.num_batches = 1, 1, 2, 2
    arms = parse_names(parser, "--arms", args.arms, list(ARMS))
    check_at_least(parser, args, dict(warmup=0, rounds=1, steps=1, num_batches=1))

    import condinit_det  # noqa: F401  (registers the project's modules)

    opts = list(args.opts)
    cfg = load_config(args.config_file, opts)
    if (
        args.quick
        and "total_batch_size" in cfg.dataloader.train
        and not any(o.startswith("dataloader.train.total_batch_size=") for o in opts)
    ):
        cfg.dataloader.train.total_batch_size = QUICK_BATCH
        opts.append(f"dataloader.train.total_batch_size={QUICK_BATCH}")
    print(format_machine_info(machine_info()))
    print(f"torch threads: {torch.get_num_threads()}; device: {cfg.train.device}")
    print(f"config: {args.config_file} {' '.join(opts)}".rstrip())
    print(
        f"schedule: {args.warmup} warmup step(s), then {args.rounds} interleaved round(s) x "
        f"{args.steps} timed step(s) per variant"
    )
    variants, mismatches = run(
        cfg,
        arms=arms,
        warmup=args.warmup,
        rounds=args.rounds,
        steps=args.steps,
        num_batches=args.num_batches,
        seed=args.seed,
    )
    print()
    print(format_results(variants))
    print()
    bad = {name: keys for name, keys in mismatches.items() if keys}
    if bad:
        for name, keys in bad.items():
            shown = ", ".join(keys[:8]) + (f" ... ({len(keys)} in all)" if len(keys) > 8 else "")
            print(f"FAIL: '{name}' differs from the baseline outside the arm's projections: {shown}")
        return 1
    print(OK_LINE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
