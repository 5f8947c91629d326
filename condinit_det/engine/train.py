"""One detection run in every process: build the armed model, train it with detectron2's trainer, evaluate.

Lazy configs train through :func:`do_train` (``SimpleTrainer`` / ``AMPTrainer`` with the project's hooks), yacs
configs through :mod:`.yacs_trainer`; ``--eval-only`` evaluates one checkpoint (:func:`do_eval_only`).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os

from detectron2.config import instantiate
from detectron2.engine import AMPTrainer, SimpleTrainer, default_setup, default_writers, hooks
from detectron2.engine.defaults import create_ddp_model
from detectron2.evaluation import inference_on_dataset, print_csv_format
from detectron2.utils import comm
from omegaconf import OmegaConf

from ..model_zoo import resolve_config_file
from ..modeling.arm import rank0_computes_arm
from ..records.failures import note_failure
from ..records.identity import read_arm_report
from ..records.results import ResultsFile
from ..stage import RunOptions
from ..tracking.events import tracker_writers
from ..utils.distributed import check_replicas, sync_buffers
from ..utils.logs import run_logging
from ..utils.preemption import Preempted
from .arm_report import AttentionSnapshot, log_arm_report, save_arm_report, weights_from
from .checkpoint import RunCheckpointer, pretrain_checkpoint_file
from .config import arm_spec, get_lr_scale, get_output_dir, get_seed, is_yacs, run_identity
from .hooks import APHook, PreemptionHook, ap_record, build_best_checkpointer

__all__ = ["build_model", "do_eval_only", "do_test", "do_train", "final_recorded", "run"]

logger = logging.getLogger("detectron2")


def _setup_logging(cfg, options: RunOptions):
    run_logging(get_output_dir(cfg), rank=comm.get_rank())
    # detectron2's default_setup reads a namespace; it prints the config file: the one behind a zoo:<name>.
    config_file = resolve_config_file(options.config_file) if options.config_file else ""
    default_setup(cfg, argparse.Namespace(**{**dataclasses.asdict(options), "config_file": config_file}))
    # default_setup also seeds every RNG from train.seed (+ the rank)


def build_model(cfg):
    """``instantiate(cfg.model)`` (which applies ``cfg.condinit``); returns (model, arm report)."""
    model = instantiate(cfg.model)
    return model, model.condinit_report


def _create_ddp(model, cfg):
    ddp = dict(cfg.train.ddp)
    if str(cfg.train.device).startswith("cpu"):
        ddp["device_ids"] = None  # DDP over CPU modules (gloo)
    return create_ddp_model(model, **ddp)


def _unwrap(model):
    return model.module if hasattr(model, "module") else model


def do_test(cfg, model):
    """Evaluate ``model`` with ``cfg.dataloader.test`` / ``cfg.dataloader.evaluator``."""
    if "evaluator" not in cfg.dataloader:
        logger.warning("cfg.dataloader.evaluator is not set: no evaluation.")
        return {}
    sync_buffers(_unwrap(model))  # every shard is scored with the statistics of the weights rank 0 saves
    ret = inference_on_dataset(model, instantiate(cfg.dataloader.test), instantiate(cfg.dataloader.evaluator))
    if comm.is_main_process():
        print_csv_format(ret)
    return ret


def _metadata(cfg, config_file):
    return {"arm": arm_spec(cfg).arm, "seed": get_seed(cfg), "lr_scale": get_lr_scale(cfg),
            "config": config_file or None}


def final_recorded(run_dir: str, max_iter: int) -> bool:
    """Whether ``run_dir`` holds an ``"ap"`` evaluation at ``max_iter`` (the run's end)."""
    rf = ResultsFile(run_dir)
    return rf.exists() and any(r["iteration"] >= max_iter for r in rf.records("ap"))


def _build_analysis_hook(cfg, config_file):
    """The conditioning-analysis hook when ``condinit_analysis.period > 0``, else None."""
    node = cfg.get("condinit_analysis")
    if node is None or int(node.get("period", 0) or 0) <= 0:
        return None
    from ..analysis.hooks import build_conditioning_hook

    return build_conditioning_hook(cfg, config_name=config_file or None)


def _dataset_name(cfg):
    node = cfg.dataloader.get("test")
    dataset = node.get("dataset") if node is not None and OmegaConf.is_dict(node) else None
    names = dataset.get("names") if dataset is not None and OmegaConf.is_dict(dataset) else None
    names = OmegaConf.to_container(names) if OmegaConf.is_config(names) else names
    names = [names] if isinstance(names, str) else list(names or [])
    return names[-1] if names else None


def _prediction_files(cfg):
    """(path the evaluator writes its COCO predictions to, ground-truth json) or (None, None)."""
    node = cfg.dataloader.get("evaluator")
    out = node.get("output_dir") if node is not None and OmegaConf.is_dict(node) else None
    name = _dataset_name(cfg)
    if not out or not name:
        return None, None
    from detectron2.data import MetadataCatalog

    return os.path.join(out, "coco_instances_results.json"), MetadataCatalog.get(name).get("json_file", None)


def do_train(options: RunOptions, cfg):
    """Train one arm as configured (lazy config). Returns the last evaluation results."""
    output_dir = cfg.train.output_dir
    max_iter = int(cfg.train.max_iter)
    metadata = _metadata(cfg, options.config_file)
    identity = run_identity(cfg)
    results_file = ResultsFile(output_dir)
    main_process = comm.is_main_process()

    # DDP broadcasts rank 0's weights when it wraps the model, so only rank 0 computes the arm.
    with rank0_computes_arm() if comm.get_world_size() > 1 else contextlib.nullcontext():
        model, report = build_model(cfg)
    model.to(cfg.train.device)

    cfg.optimizer.params.model = model
    optim = instantiate(cfg.optimizer)
    train_loader = instantiate(cfg.dataloader.train)

    ddp_model = _create_ddp(model, cfg)
    trainer = (AMPTrainer if cfg.train.amp.enabled else SimpleTrainer)(ddp_model, train_loader, optim)
    checkpointer = RunCheckpointer(ddp_model, output_dir, optimizer=optim, trainer=trainer,
                                   trust_pickle=options.trust_pickle, metadata=metadata)
    eval_period = int(cfg.train.eval_period)
    last_results = {}

    def evaluate():
        nonlocal last_results
        last_results = do_test(cfg, ddp_model)
        return last_results

    predictions, ground_truth = _prediction_files(cfg)
    trainer.register_hooks(
        [
            hooks.IterationTimer(),
            hooks.LRScheduler(scheduler=instantiate(cfg.lr_multiplier)),
            hooks.PeriodicCheckpointer(checkpointer, **cfg.train.checkpointer) if main_process else None,
            APHook(eval_period, evaluate, results_file=results_file, metadata=metadata,
                   predictions_file=predictions, ground_truth=ground_truth),
            build_best_checkpointer(eval_period, checkpointer, results_file=results_file) if main_process else None,
            PreemptionHook(checkpointer, output_dir),
            _build_analysis_hook(cfg, options.config_file),
            # + the W&B / MLflow runs of this run (main process; the storage counts from iteration 0)
            hooks.PeriodicWriter(default_writers(output_dir, max_iter) + tracker_writers(step_offset=1,
                                                                                         max_step=max_iter),
                                 period=cfg.train.log_period)
            if main_process else None,
        ]
    )

    init = pretrain_checkpoint_file(cfg.train.init_checkpoint) if cfg.train.init_checkpoint else ""
    will_resume = options.resume and checkpointer.has_checkpoint()
    snapshot = AttentionSnapshot(model) if init and not will_resume else None
    checkpointer.resume_or_load(init, resume=options.resume)
    provenance = None
    if snapshot is not None:
        overwritten = snapshot.overwritten(model)
        pretrain_arm = (checkpointer.pretrain_meta or {}).get("arm")
        provenance = weights_from(report, overwritten, init, pretrain_arm)
        if overwritten:
            logger.warning(f"train.init_checkpoint={init} holds the attention weights of {len(overwritten)} of "
                           f"{len(report.sites)} site(s): they come from the checkpoint"
                           + (f" (pretrained with arm '{pretrain_arm}')" if pretrain_arm else
                              f", not from the '{report.arm}' arm") + ".")
        del snapshot
    log_arm_report(report, provenance)
    if main_process and not will_resume:
        save_arm_report(output_dir, report, identity, provenance, init_checkpoint=init or None)
    check_replicas(_unwrap(ddp_model), "before training")

    # The checkpoint stores the iteration that just finished.
    start_iter = trainer.iter + 1 if will_resume else 0
    if start_iter >= max_iter:
        logger.info(f"{output_dir}: training already finished ({max_iter} iterations).")
        if not final_recorded(output_dir, max_iter):
            last_results = do_test(cfg, ddp_model)
            if main_process:
                results_file.add(ap_record(last_results, iteration=max_iter, **metadata))
        return last_results
    try:
        trainer.train(start_iter, max_iter)
    except Preempted:
        raise
    except Exception as e:
        note_failure(output_dir, e, rank=comm.get_rank(), iteration=trainer.iter)
        raise
    check_replicas(_unwrap(ddp_model), "after training")
    return last_results


def do_eval_only(options: RunOptions, cfg):
    """
    Evaluate ``train.init_checkpoint`` (or, with --resume, the run's last checkpoint) and add an
    ``"eval"`` record. The checkpoint supplies every weight; the record names the arm of the run
    directory's arm report when there is one.
    """
    model, _ = build_model(cfg)
    model.to(cfg.train.device)
    model = _create_ddp(model, cfg)
    checkpointer = RunCheckpointer(model, cfg.train.output_dir, trust_pickle=options.trust_pickle)
    path = checkpointer.get_checkpoint_file() if options.resume and checkpointer.has_checkpoint() \
        else cfg.train.init_checkpoint
    if not path:
        raise ValueError("--eval-only needs train.init_checkpoint=PATH (or --resume in a run directory).")
    extra = checkpointer.load(path)
    results = do_test(cfg, model)
    if comm.is_main_process() and results:
        it = extra.get("iteration") if isinstance(extra, dict) else None
        metadata = _metadata(cfg, options.config_file)
        previous = (read_arm_report(cfg.train.output_dir) or {}).get("run") or {}
        metadata["arm"] = previous.get("arm", metadata["arm"])
        record = ap_record(results, iteration=0 if it is None else int(it) + 1, kind="eval", **metadata)
        record["checkpoint"] = path
        ResultsFile(cfg.train.output_dir).add(record)
    return results


def run(options: RunOptions, cfg) -> dict:
    """Train (or with ``options.eval_only`` evaluate) one run as ``cfg`` says, in this process (every process of
    the run calls it). Returns the last evaluation's results (yacs training: None)."""
    _setup_logging(cfg, options)
    if is_yacs(cfg):
        from .yacs_trainer import run_yacs

        return run_yacs(options, cfg, run_identity(cfg))
    if options.eval_only:
        return do_eval_only(options, cfg)
    return do_train(options, cfg)
