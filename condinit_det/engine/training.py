"""
Training and evaluation entry points behind ``tools/train_net.py``.

Lazy (``.py``) configs follow detectron2's ``tools/lazyconfig_train_net.py`` conventions and
read: ``model``, ``optimizer``, ``lr_multiplier``, ``dataloader.{train,test,evaluator}``,
``train.{output_dir, init_checkpoint, max_iter, eval_period, log_period, checkpointer, ddp,
amp.enabled, device, seed}``, ``condinit`` (the arm, see ``configs/common/condinit.py``) and the
optional ``condinit_analysis`` (conditioning analysis hook; ``period=0`` or absent: off).
yacs (``.yaml``) configs take the ``DefaultTrainer`` path with the project's keys added by
``condinit_det.config.add_condinit_config``.

Seeds: a negative ``train.seed`` (detectron2's "random") is replaced by 0, so that separate
runs of different arms share data order and every non-attention weight; set ``train.seed=N``
for another repetition. ``condinit.seed: None`` follows ``train.seed``.
"""
import gc
import json
import logging
import os
from typing import Dict, List, Optional

import torch

from detectron2.checkpoint import DetectionCheckpointer
from detectron2.config import CfgNode, LazyConfig, instantiate
from detectron2.engine import (
    AMPTrainer,
    SimpleTrainer,
    default_argument_parser,
    default_setup,
    default_writers,
    hooks,
)
from detectron2.engine.defaults import create_ddp_model
from detectron2.evaluation import inference_on_dataset, print_csv_format
from detectron2.utils import comm
from omegaconf import OmegaConf, open_dict

from condinit_det.init import ARMS, find_attention
from condinit_det.modeling.arm import ARM_REPORT_FILE, apply_arm_config

from .hooks import APHook, ap_record, build_best_checkpointer
from .results import ResultsFile

__all__ = [
    "ARM_CHOICES",
    "REPORT_DIRNAME",
    "build_argument_parser",
    "load_config",
    "prepare_config",
    "build_model",
    "do_test",
    "do_train",
    "run",
    "run_all_arms",
    "main",
]

logger = logging.getLogger("detectron2")

ARM_CHOICES = tuple(ARMS) + ("all",)
REPORT_DIRNAME = "report"
DEFAULT_SEED = 0

_EPILOG = """
Examples:

Train one arm on one machine (lazy config, CPU):
    $ tools/train_net.py --config-file configs/demo/mask_rcnn_vit_tiny.py --arm conditioned

Train the three arms one after the other into <output_dir>/{default,mimetic,conditioned}/,
then write the comparison into <output_dir>/report/:
    $ tools/train_net.py --config-file cfg.py --arm all train.output_dir=output/exp1

Resume (an arm that already finished is skipped):
    $ tools/train_net.py --config-file cfg.py --arm all --resume train.output_dir=output/exp1

Run on 8 GPUs:
    $ tools/train_net.py --num-gpus 8 --config-file cfg.py train.device=cuda

Run on multiple machines:
    (machine0)$ tools/train_net.py --machine-rank 0 --num-machines 2 --dist-url <URL> [--other-flags]
    (machine1)$ tools/train_net.py --machine-rank 1 --num-machines 2 --dist-url <URL> [--other-flags]
"""


def build_argument_parser():
    """detectron2's ``default_argument_parser`` plus ``--arm``."""
    parser = default_argument_parser(epilog=_EPILOG)
    parser.add_argument(
        "--arm",
        choices=ARM_CHOICES,
        default=None,
        help="attention-init arm (sets condinit.arm); 'all' trains the three arms one after the "
        "other with the same seed into <output_dir>/<arm>/ and writes <output_dir>/report/. "
        "Default: the config's condinit.arm.",
    )
    return parser


# ---------------------------------------------------------------------------------------------
# Configs: lazy (DictConfig) and yacs (CfgNode) behind a few accessors.
# ---------------------------------------------------------------------------------------------
def _is_yacs_file(path: str) -> bool:
    if not path.endswith((".yaml", ".yml")):
        return False
    import yaml

    with open(path) as f:
        data = yaml.safe_load(f) or {}
    # yacs configs use upper-case keys (MODEL, SOLVER, _BASE_); a saved lazy config does not.
    return any(str(k).isupper() or k == "_BASE_" for k in data)


def load_config(config_file: str, opts: Optional[List[str]] = None):
    """Load a lazy (.py, or a saved lazy .yaml) or yacs (.yaml) config and apply overrides."""
    if not config_file:
        raise ValueError("--config-file is required (a lazy .py config or a yacs .yaml config).")
    if not os.path.isfile(config_file):
        raise FileNotFoundError(f"Config file {config_file} does not exist.")
    opts = list(opts or [])
    if _is_yacs_file(config_file):
        from detectron2.config import get_cfg

        try:
            from condinit_det.config import add_condinit_config
        except ImportError as e:
            raise ImportError(
                "yacs configs need condinit_det.config.add_condinit_config, which is not "
                f"importable ({e}); use a lazy .py config instead."
            ) from e
        cfg = get_cfg()
        add_condinit_config(cfg)
        cfg.merge_from_file(config_file)
        cfg.merge_from_list(opts)
        return cfg
    if not config_file.endswith((".py", ".yaml", ".yml")):
        raise ValueError(f"Config file {config_file} must end in .py (lazy) or .yaml (yacs or lazy).")
    cfg = LazyConfig.load(config_file)
    return LazyConfig.apply_overrides(cfg, opts)


def _is_yacs(cfg) -> bool:
    return isinstance(cfg, CfgNode)


def get_output_dir(cfg) -> str:
    return cfg.OUTPUT_DIR if _is_yacs(cfg) else cfg.train.output_dir


def get_max_iter(cfg) -> int:
    return int(cfg.SOLVER.MAX_ITER if _is_yacs(cfg) else cfg.train.max_iter)


def get_seed(cfg) -> int:
    return int(cfg.SEED if _is_yacs(cfg) else cfg.train.get("seed", -1))


def get_arm(cfg) -> str:
    if _is_yacs(cfg):
        return str(cfg.MODEL.CONDINIT.ARM)
    node = cfg.get("condinit")
    return "default" if node is None else str(node.get("arm", "default"))


def prepare_config(cfg, *, arm: Optional[str] = None, output_dir: Optional[str] = None):
    """
    Set the arm and output directory, and fix the seeds (see the module docstring). Returns cfg
    (modified in place).
    """
    if arm is not None and arm not in ARMS:
        raise ValueError(f"Unknown arm {arm!r}; accepted: {', '.join(ARMS)}")
    if _is_yacs(cfg):
        cfg.defrost()
        if arm is not None:
            cfg.MODEL.CONDINIT.ARM = arm
        if output_dir is not None:
            cfg.OUTPUT_DIR = output_dir
        if cfg.SEED < 0:
            logger.info(f"SEED={cfg.SEED} (random) replaced by {DEFAULT_SEED} so arms stay comparable.")
            cfg.SEED = DEFAULT_SEED
        cfg.freeze()
        return cfg

    with open_dict(cfg):
        if "condinit" not in cfg or cfg.condinit is None:
            cfg.condinit = OmegaConf.create({"arm": "default"})
        if arm is not None:
            cfg.condinit.arm = arm
        if output_dir is not None:
            cfg.train.output_dir = output_dir
        seed = cfg.train.get("seed", -1)
        if seed is None or seed < 0:
            logger.info(
                f"train.seed={seed} (random) replaced by {DEFAULT_SEED} so that arms share data "
                "order and non-attention weights; set train.seed=N to choose another seed."
            )
            cfg.train.seed = DEFAULT_SEED
        if cfg.condinit.get("seed") is None:
            cfg.condinit.seed = cfg.train.seed
    return cfg


def _reset_loggers():
    """Drop the handlers of a previous run's setup so each run logs once, into its own dir."""
    from detectron2.utils.logger import setup_logger

    for name in ("detectron2", "fvcore", "condinit_det"):
        lg = logging.getLogger(name)
        for h in list(lg.handlers):
            lg.removeHandler(h)
    setup_logger.cache_clear()


def _setup_logging(cfg, args):
    _reset_loggers()
    default_setup(cfg, args)
    from detectron2.utils.logger import setup_logger

    # The project's own modules (arm report, results) log alongside detectron2's.
    setup_logger(get_output_dir(cfg), distributed_rank=comm.get_rank(), name="condinit_det")


# ---------------------------------------------------------------------------------------------
# Model, checkpoint, evaluation
# ---------------------------------------------------------------------------------------------
def build_model(cfg):
    """``instantiate(cfg.model)`` and apply ``cfg.condinit``; returns (model, arm report)."""
    model = instantiate(cfg.model)
    report = apply_arm_config(
        model,
        cfg.get("condinit"),
        output_dir=cfg.train.output_dir,
        is_main_process=comm.is_main_process(),
    )
    _log_arm_report(report, cfg.train.output_dir)
    return model, report


def _log_arm_report(report, output_dir):
    sites = report.sites
    logger.info(
        f"Attention-init arm '{report.arm}' (seed {report.seed}, options {report.options}): "
        f"{len(sites)} attention site(s), {len(report.changed_parameters())} parameter(s) changed."
    )
    for s in sites:
        logger.info(f"  {s.name} [{s.kind}] heads={s.num_heads} dh={s.head_dim}: "
                    f"{', '.join(s.changed) or 'unchanged'}")
    if output_dir:
        logger.info(f"Arm report saved to {os.path.join(output_dir, ARM_REPORT_FILE)}")


def _attention_parameters(model) -> Dict[str, List[str]]:
    """site name -> qualified names of its projection parameters."""
    return {site.name: site.parameter_names() for site in find_attention(model)}


def _snapshot(model, names_by_site):
    params = dict(model.named_parameters())
    return {n: params[n].detach().clone() for names in names_by_site.values() for n in names if n in params}


def _log_checkpoint_override(model, arm, path, names_by_site, snapshot):
    params = dict(model.named_parameters())
    overridden = [
        site
        for site, names in names_by_site.items()
        if any(n in snapshot and not torch.equal(params[n].detach(), snapshot[n]) for n in names)
    ]
    if overridden:
        logger.warning(
            f"train.init_checkpoint={path} holds the attention weights of {len(overridden)} of "
            f"{len(names_by_site)} attention site(s): the loaded weights override the '{arm}' "
            f"arm there ({', '.join(overridden)}). Only sites absent from the checkpoint keep the arm."
        )
    else:
        logger.info(
            f"train.init_checkpoint={path} holds none of the {len(names_by_site)} attention "
            f"site(s): the '{arm}' arm is kept everywhere."
        )
    return overridden


def do_test(cfg, model):
    """Evaluate ``model`` with ``cfg.dataloader.test`` / ``cfg.dataloader.evaluator``."""
    if "evaluator" not in cfg.dataloader:
        logger.warning("cfg.dataloader.evaluator is not set: no evaluation.")
        return {}
    ret = inference_on_dataset(
        model, instantiate(cfg.dataloader.test), instantiate(cfg.dataloader.evaluator)
    )
    if comm.is_main_process():
        print_csv_format(ret)
    return ret


def _metadata(cfg, config_file):
    return {"arm": get_arm(cfg), "seed": get_seed(cfg), "config": config_file or None}


def _final_recorded(cfg) -> bool:
    max_iter = get_max_iter(cfg)
    out = get_output_dir(cfg)
    rf = ResultsFile(out)
    return rf.exists() and any(r["iteration"] >= max_iter for r in rf.records("ap"))


def _build_analysis_hook(cfg, config_file):
    """The conditioning-analysis hook when ``condinit_analysis.period > 0``, else None."""
    node = cfg.get("condinit_analysis")
    if node is None or int(node.get("period", 0) or 0) <= 0:
        return None
    from condinit_det.analysis.hooks import build_conditioning_hook

    return build_conditioning_hook(cfg, config_name=config_file or None)


def do_train(args, cfg):
    """Train one arm as configured (lazy config). Returns the last evaluation results."""
    output_dir = cfg.train.output_dir
    max_iter = int(cfg.train.max_iter)
    metadata = _metadata(cfg, args.config_file)
    results_file = ResultsFile(output_dir)
    if not args.resume and comm.is_main_process():
        old = results_file.archive()
        if old:
            logger.warning(f"Fresh (non --resume) run: previous results moved to {old}")

    model, report = build_model(cfg)
    model.to(cfg.train.device)

    cfg.optimizer.params.model = model
    optim = instantiate(cfg.optimizer)
    train_loader = instantiate(cfg.dataloader.train)

    ddp_model = create_ddp_model(model, **cfg.train.ddp)
    trainer = (AMPTrainer if cfg.train.amp.enabled else SimpleTrainer)(ddp_model, train_loader, optim)
    checkpointer = DetectionCheckpointer(ddp_model, output_dir, optimizer=optim, trainer=trainer)
    eval_period = int(cfg.train.eval_period)
    last_results = {}

    def evaluate():
        nonlocal last_results
        last_results = do_test(cfg, ddp_model)
        return last_results

    main = comm.is_main_process()
    trainer.register_hooks(
        [
            hooks.IterationTimer(),
            hooks.LRScheduler(scheduler=instantiate(cfg.lr_multiplier)),
            hooks.PeriodicCheckpointer(checkpointer, **cfg.train.checkpointer) if main else None,
            APHook(eval_period, evaluate, results_file=results_file, metadata=metadata),
            build_best_checkpointer(eval_period, checkpointer, results_file=results_file) if main else None,
            _build_analysis_hook(cfg, args.config_file),
            hooks.PeriodicWriter(default_writers(output_dir, max_iter), period=cfg.train.log_period)
            if main
            else None,
        ]
    )

    init = cfg.train.init_checkpoint
    will_resume = args.resume and checkpointer.has_checkpoint()
    names_by_site = snapshot = None
    if init and not will_resume:
        names_by_site = _attention_parameters(model)
        snapshot = _snapshot(model, names_by_site)
    checkpointer.resume_or_load(init, resume=args.resume)
    if snapshot is not None:
        _log_checkpoint_override(model, report.arm, init, names_by_site, snapshot)
        del snapshot

    # The checkpoint stores the iteration that just finished.
    start_iter = trainer.iter + 1 if will_resume else 0
    if start_iter >= max_iter:
        logger.info(f"{output_dir}: training already finished ({max_iter} iterations).")
        if not _final_recorded(cfg):
            last_results = do_test(cfg, ddp_model)
            if main:
                results_file.add(ap_record(last_results, iteration=max_iter, **metadata))
        return last_results
    trainer.train(start_iter, max_iter)
    return last_results


def do_eval_only(args, cfg):
    """
    Evaluate ``train.init_checkpoint`` (or, with --resume, the run's last checkpoint) and add a
    ``"eval"`` record. The checkpoint supplies every weight, so no arm is applied, and the run's
    arm report is left as it is (the record names the arm found there).
    """
    model = instantiate(cfg.model)
    model.to(cfg.train.device)
    model = create_ddp_model(model)
    checkpointer = DetectionCheckpointer(model, cfg.train.output_dir)
    path = checkpointer.get_checkpoint_file() if args.resume and checkpointer.has_checkpoint() \
        else cfg.train.init_checkpoint
    if not path:
        raise ValueError("--eval-only needs train.init_checkpoint=PATH (or --resume in a run directory).")
    extra = checkpointer.load(path)
    results = do_test(cfg, model)
    if comm.is_main_process() and results:
        it = extra.get("iteration") if isinstance(extra, dict) else None
        metadata = _metadata(cfg, args.config_file)
        arm_report = os.path.join(cfg.train.output_dir, ARM_REPORT_FILE)
        if os.path.isfile(arm_report):
            with open(arm_report) as f:
                metadata["arm"] = json.load(f).get("arm", metadata["arm"])
        record = ap_record(results, iteration=0 if it is None else int(it) + 1, kind="eval", **metadata)
        record["checkpoint"] = path
        ResultsFile(cfg.train.output_dir).add(record)
    return results


# ---------------------------------------------------------------------------------------------
# Process-level entry points (called by detectron2.engine.launch in every worker)
# ---------------------------------------------------------------------------------------------
def run(args, cfg=None):
    """Train (or evaluate) one arm; ``cfg`` defaults to the one in ``args``."""
    if cfg is None:
        cfg = prepare_config(load_config(args.config_file, args.opts), arm=args.arm)
    _setup_logging(cfg, args)
    if _is_yacs(cfg):
        from .yacs_trainer import run_yacs

        return run_yacs(args, cfg)
    if args.eval_only:
        return do_eval_only(args, cfg)
    return do_train(args, cfg)


def run_all_arms(args):
    """
    Train default, mimetic and conditioned one after the other, with the same seed, into
    ``<output_dir>/<arm>/``; then write and print the comparison (``<output_dir>/report/``).
    With --resume an arm whose final evaluation is recorded is skipped.
    """
    if args.eval_only:
        raise ValueError("--arm all trains the three arms; it cannot be combined with --eval-only.")
    from detectron2.utils.logger import setup_logger

    _reset_loggers()
    setup_logger(distributed_rank=comm.get_rank())  # console only, until each arm's own setup
    base = get_output_dir(load_config(args.config_file, args.opts))
    if not base:
        raise ValueError("--arm all needs an output directory (train.output_dir / OUTPUT_DIR).")
    arm_dirs = []
    for arm in ARMS:
        arm_dir = os.path.join(base, arm)
        arm_dirs.append(arm_dir)
        cfg = prepare_config(load_config(args.config_file, args.opts), arm=arm, output_dir=arm_dir)
        if args.resume and _final_recorded(cfg):
            logger.info(f"Arm '{arm}' already finished in {arm_dir}: skipped, results kept.")
            continue
        run(args, cfg)
        comm.synchronize()
        gc.collect()
    text = None
    if comm.is_main_process():
        from condinit_det.report import compare_arms

        report_dir = os.path.join(base, REPORT_DIRNAME)
        _, text = compare_arms(arm_dirs, output_dir=report_dir)
        print(text, flush=True)
        print(f"Report written to {report_dir}", flush=True)
    comm.synchronize()
    return text


def main(args):
    """Per-process entry point: ``--arm all`` or a single arm."""
    if args.arm == "all":
        return run_all_arms(args)
    return run(args)
