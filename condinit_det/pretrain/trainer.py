"""One pretraining run: build the armed classifier, train epoch by epoch, evaluate, checkpoint, export.

Reproducibility contract (same seed => same run, whatever the arm):
- the global RNGs (python, numpy, torch) are seeded with the training seed on every process before
  the model is built, so every weight outside the arm's projections is identical across arms and
  across processes; the arm draws from its own generators and never moves the global RNG;
- every epoch starts by re-seeding all RNGs from ``(seed, epoch, rank)`` and the sampler from
  ``(seed, epoch)``: data order, augmentation, mixup and drop-path draws of an epoch do not depend
  on what ran before it, so a run resumed at an epoch boundary continues exactly as an
  uninterrupted one (bitwise on the same hardware and thread count).

Per epoch the main process adds a ``"cls"`` record to ``results.json`` (when evaluated) and then
writes the checkpoint: the checkpoint is the commit point, so a killed run repeats at most the
epoch that had not been checkpointed and its record is replaced, never duplicated.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import time
from typing import Dict, Optional

import numpy as np
import torch
import torch.nn as nn

from ..utils.checkpoint_io import load_checkpoint
from ..utils.distributed import replica_fingerprint
from ..utils.fileio import atomic_torch_save, atomic_write, remove_stale_temp_files
from ..records.results import ResultsFile
from ..utils.preemption import PreemptionWatch
from ..utils.preemption import PREEMPTED_FILENAME, Preempted
from ..records.layout import RunSpec
from ..records.identity import check_resume_identity, write_arm_report
from ..records.failures import note_failure
from .checkpoint import FINAL_FILENAME, FINAL_FORMAT, FINAL_SAFETENSORS, checkpoint_path, find_checkpoints
from .checkpoint import last_checkpoint, prune_checkpoints, save_final
from .config import DEFAULTS, UsageError, arm_spec, node, resolve_lr, run_identity
from .data import build_datasets, build_mixup, build_train_loader, build_train_sampler, epoch_seed, set_sampler_epoch
from .data import data_config, set_transforms
from .evaluate import evaluate
from .model import build_armed_model, create_classifier, state_digest
from .writers import MetricsWriter, StepTimer, setup_logging, truncate_metrics

__all__ = ["PREDICTIONS_FILENAME", "evaluate_checkpoint", "run_finished", "total_epochs", "train_run"]

PREDICTIONS_FILENAME = "eval_predictions.json"
logger = logging.getLogger("condinit_det.pretrain")


# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------
def _comm():
    from detectron2.utils import comm

    return comm


def seed_all(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) global RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)


def _device(train: Dict) -> torch.device:
    kind = str(train["device"])
    if kind.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError("train.device='cuda' but no CUDA device is available; pass train.device=cpu")
        return torch.device("cuda", _comm().get_local_rank())
    if kind != "cpu":
        raise UsageError(f"train.device={kind!r}; accepted: cuda, cpu")
    return torch.device("cpu")


def _amp_dtype(train: Dict, device: torch.device) -> Optional[torch.dtype]:
    if not train["amp"] or device.type != "cuda":
        return None
    dtypes = {"float16": torch.float16, "bfloat16": torch.bfloat16}
    if train["amp_dtype"] not in dtypes:
        raise UsageError(f"train.amp_dtype={train['amp_dtype']!r}; accepted: {', '.join(dtypes)}")
    return dtypes[train["amp_dtype"]]


def total_epochs(cfg) -> int:
    """Epochs the run trains: ``train.epochs`` + cooldown (+ warmup when it is a prefix), as timm's scheduler counts."""
    train, sched = node(cfg, "train"), node(cfg, "scheduler")
    extra = int(sched["cooldown_epochs"]) + (int(sched["warmup_epochs"]) if sched["warmup_prefix"] else 0)
    return int(train["epochs"]) + extra


def run_finished(run_dir: str, epochs: int) -> bool:
    """True when the final evaluation is recorded and ``model_final.pth`` exists."""
    rf = ResultsFile(run_dir)
    done = rf.exists() and any(r.get("epoch", 0) >= epochs for r in rf.records("cls"))
    return done and os.path.isfile(os.path.join(run_dir, FINAL_FILENAME))


def rng_state() -> Dict[str, torch.Tensor]:
    """The global RNG states as tensors (so checkpoints load with ``weights_only=True``): python's and
    numpy's Mersenne Twister words with their position last, torch's byte state. A record only: each
    epoch re-seeds every RNG from ``(seed, epoch, rank)``, so resuming needs none of them."""
    _, words, _ = random.getstate()
    _, keys, pos, _, _ = np.random.get_state()
    return {"python": torch.tensor(words, dtype=torch.int64),
            "numpy": torch.from_numpy(np.append(keys.astype(np.int64), pos)),
            "torch": torch.get_rng_state()}


def _start_fresh(run_dir: str) -> None:
    """A run started without --resume: set the previous run's files aside (results, metrics) or delete them."""
    old = ResultsFile(run_dir).archive()
    if old:
        logger.warning(f"Fresh (non --resume) run: previous results moved to {old}")
    metrics = os.path.join(run_dir, "metrics.json")
    if os.path.isfile(metrics):
        n = 0
        while os.path.exists(os.path.join(run_dir, f"metrics.{n}.json.bak")):
            n += 1
        os.replace(metrics, os.path.join(run_dir, f"metrics.{n}.json.bak"))
    stale = list(find_checkpoints(run_dir).values())
    stale += [os.path.join(run_dir, name) for name in (FINAL_FILENAME, FINAL_SAFETENSORS, PREDICTIONS_FILENAME)
              if os.path.isfile(os.path.join(run_dir, name))]
    for path in stale:
        os.remove(path)
    if stale:
        logger.warning(f"Fresh (non --resume) run: removed the previous run's {', '.join(map(os.path.basename, stale))}")


def _check_replicas(digest: str, when: str = "initial") -> None:
    """Every process holds the same ``digest``; raises otherwise (no-op in one process)."""
    comm = _comm()
    if comm.get_world_size() == 1:
        return
    digests = comm.all_gather(digest)
    if len(set(digests)) != 1:
        raise RuntimeError(f"processes hold different {when} weights (sha1 per rank: {digests})")
    if when == "initial":
        logger.info(f"{len(digests)} processes start from identical weights (sha1 {digest[:12]})")
    else:
        logger.info(f"{len(digests)} processes hold identical {when} weights (sha1 {digest[:12]})")


def _mean_over_processes(total: float, count: int) -> float:
    comm = _comm()
    parts = comm.all_gather((total, count)) if comm.get_world_size() > 1 else [(total, count)]
    n = sum(c for _, c in parts)
    return sum(t for t, _ in parts) / n if n else float("nan")


def _current_lr(optimizer: torch.optim.Optimizer) -> float:
    return max(group["lr"] for group in optimizer.param_groups)


def _criterion(augment: Dict, mixup) -> nn.Module:
    from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy

    if mixup is not None:  # the targets are already smoothed by Mixup
        return SoftTargetCrossEntropy()
    if augment["label_smoothing"] > 0:
        return LabelSmoothingCrossEntropy(smoothing=augment["label_smoothing"])
    return nn.CrossEntropyLoss()


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------
def train_one_epoch(*, ddp: nn.Module, model: nn.Module, loader, optimizer, scheduler, scaler, criterion, mixup,
                    ema, device: torch.device, amp_dtype, clip: Optional[float], clip_mode: str, step: int,
                    epoch: int, num_epochs: int, log_period: int, timer: StepTimer,
                    writer: Optional[MetricsWriter], stop_requested=lambda: False) -> tuple:
    """Train one epoch; returns (summed step losses, number of steps, optimizer steps done in total).
    ``stop_requested()`` is asked before every step (collective: a requeue stops every process at once)."""
    from timm.utils import dispatch_clip_grad

    ddp.train()
    steps_per_epoch = len(loader)
    total, count = 0.0, 0
    autocast = (torch.autocast(device_type=device.type, dtype=amp_dtype) if amp_dtype is not None
                else contextlib.nullcontext())
    end = time.perf_counter()
    for i, (images, targets) in enumerate(loader):
        if stop_requested():
            raise Preempted(f"stopped for a requeue in epoch {epoch + 1}, step {step}")
        data_time = time.perf_counter() - end
        images = images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        if mixup is not None:
            images, targets = mixup(images, targets)
        with autocast:
            loss = criterion(ddp(images), targets)
        optimizer.zero_grad(set_to_none=True)
        if scaler.is_enabled():
            scaler.scale(loss).backward()
            if clip is not None:
                scaler.unscale_(optimizer)
                dispatch_clip_grad(model.parameters(), value=clip, mode=clip_mode)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            if clip is not None:
                dispatch_clip_grad(model.parameters(), value=clip, mode=clip_mode)
            optimizer.step()
        step += 1
        if scheduler is not None:
            scheduler.step_update(num_updates=step)
        if ema is not None:
            ema.update(model, step=step)
        value = loss.item()
        if not math.isfinite(value):
            error = FloatingPointError(f"loss became {value} at step {step} (epoch {epoch + 1}); lower the learning "
                                       "rate (--lr-scale) or enable gradient clipping (optimizer.clip_grad)")
            error.step = step  # the run's failure record names the step it diverged at
            raise error
        total += value
        count += 1
        timer.update(value, time.perf_counter() - end, data_time)
        if step % log_period == 0 or i + 1 == steps_per_epoch:
            lr = _current_lr(optimizer)
            logger.info(f"epoch {epoch + 1}/{num_epochs}  iter {i + 1}/{steps_per_epoch}  step {step}/"
                        f"{timer.total_steps}  loss {timer.median_loss:.4f}  lr {lr:.3g}  time {timer.step_time:.3f}s"
                        f"  data {timer.data_time:.3f}s  eta {timer.eta(step)}")
            if writer is not None and step % log_period == 0:
                writer.write(step, {"epoch": epoch + (i + 1) / steps_per_epoch, "total_loss": timer.median_loss,
                                    "lr": lr, "time": timer.step_time, "data_time": timer.data_time})
        end = time.perf_counter()
    return total, count, step


def train_run(cfg, *, run: RunSpec, run_dir: str, config_file: Optional[str], resume: bool,
              allow_changed_run: bool = False, trust_pickle: bool = False) -> Optional[dict]:
    """Train one run into ``run_dir`` (every process calls it); returns the last ``"cls"`` record.

    ``trust_pickle`` lets --resume load an epoch checkpoint that needs full unpickling (written
    before checkpoints held tensors and plain containers only)."""
    from timm.optim import create_optimizer_v2
    from timm.scheduler import create_scheduler_v2
    from timm.utils import ModelEmaV3

    comm = _comm()
    rank, world = comm.get_rank(), comm.get_world_size()
    main = rank == 0
    setup_logging(run_dir, rank=rank)
    nodes = {name: node(cfg, name) for name in DEFAULTS}
    data, augment, opt, sched, train = (nodes[k] for k in ("data", "augment", "optimizer", "scheduler", "train"))
    seed = int(train["seed"])
    spec = arm_spec(cfg, seed)
    identity = run_identity(spec, seed=seed, lr_scale=run.lr_scale)
    if resume:
        check_resume_identity(run_dir, identity, allow_change=allow_changed_run)
    device = _device(train)
    amp_dtype = _amp_dtype(train, device)
    resume_from = last_checkpoint(run_dir) if resume else None
    if main:
        os.makedirs(run_dir, exist_ok=True)
        remove_stale_temp_files(run_dir)
        if not resume:
            _start_fresh(run_dir)
    comm.synchronize()
    logger.info(f"Run {run_dir}: arm {spec.arm}, seed {seed}, lr scale {run.lr_scale:g}, {world} process(es), "
                f"device {device}{', AMP ' + str(amp_dtype).split('.')[-1] if amp_dtype else ''}")

    # Model first, from the training seed, identical on every process; then the arm (own generators).
    seed_all(seed)
    model, report = build_armed_model(nodes["model"], int(data["num_classes"]), spec)
    digest = state_digest(model)
    _check_replicas(digest)
    logger.info(f"{report.summary()}; initial weights sha1 {digest[:12]}")
    if main:
        write_arm_report(run_dir, {**report.to_dict(), "stage": "pretrain", "initial_state_sha1": digest}, identity)

    datasets = build_datasets(data)
    set_transforms(datasets, data=data, augment=augment, model=model)
    model.to(device)
    ema = ModelEmaV3(model, decay=float(train["ema"]["decay"])) if train["ema"]["enabled"] else None

    batch = int(train["batch_size"]) // world
    sampler = build_train_sampler(datasets.train, augment, world_size=world, rank=rank)
    loader = build_train_loader(datasets.train, sampler, batch_size=batch, workers=int(train["workers"]),
                                pin_memory=device.type == "cuda")
    steps_per_epoch = len(loader)
    if steps_per_epoch == 0:
        raise UsageError(f"{len(datasets.train)} training images give no full batch of {batch} per process")
    lr = resolve_lr(opt, int(train["batch_size"]), run.lr_scale)
    opt_kwargs = {k: opt[k] for k in ("betas", "eps") if opt[k] is not None}
    optimizer = create_optimizer_v2(model, opt=opt["opt"], lr=lr, weight_decay=opt["weight_decay"],
                                    momentum=opt["momentum"], layer_decay=opt["layer_decay"], **opt_kwargs)
    scheduler, num_epochs = create_scheduler_v2(
        optimizer, sched=sched["sched"], num_epochs=int(train["epochs"]), warmup_epochs=sched["warmup_epochs"],
        warmup_lr=sched["warmup_lr"], min_lr=sched["min_lr"], cooldown_epochs=sched["cooldown_epochs"],
        warmup_prefix=sched["warmup_prefix"], step_on_epochs=False, updates_per_epoch=steps_per_epoch)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    mixup = build_mixup(augment, datasets.num_classes)
    criterion = _criterion(augment, mixup)
    logger.info(f"{len(datasets.train)} training / {len(datasets.val)} evaluation images, {datasets.num_classes} "
                f"classes ({datasets.root}); {num_epochs} epochs x {steps_per_epoch} steps of {batch} x {world}; "
                f"lr {lr:.4g}")

    start_epoch, step = 0, 0
    if resume_from:
        state = load_checkpoint(resume_from, trust_pickle=trust_pickle)
        if state.get("steps_per_epoch") != steps_per_epoch or state.get("num_epochs") != num_epochs:
            raise UsageError(f"{resume_from} was written with {state.get('num_epochs')} epochs x "
                             f"{state.get('steps_per_epoch')} steps, this run has {num_epochs} x {steps_per_epoch}; "
                             "resume with the same data, batch size and schedule")
        model.load_state_dict(state["model"])
        if ema is not None and state.get("ema") is not None:
            ema.module.load_state_dict(state["ema"])
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None and state.get("scheduler") is not None:
            scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        start_epoch, step = int(state["epoch"]), int(state["step"])
        logger.info(f"Resumed from {resume_from}: {start_epoch} epoch(s), {step} step(s) done")
    if scheduler is not None:
        scheduler.step_update(num_updates=step)

    ddp = model
    if world > 1:
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    writer = None
    if main:
        truncate_metrics(run_dir, max_iteration=step)
        writer = MetricsWriter(run_dir, purge_step=step)
    results = ResultsFile(run_dir)
    meta = {"arm": spec.arm, "seed": seed, "lr_scale": float(run.lr_scale), "config": config_file}
    eval_batch = int(train["eval_batch_size"] or max(1, int(1.5 * batch)))
    eval_period = max(int(train["eval_period"]), 1)
    timer = StepTimer(total_steps=num_epochs * steps_per_epoch)
    last_record = None
    watch = PreemptionWatch()
    try:
        for epoch in range(start_epoch, num_epochs):
            s = epoch_seed(seed, epoch, rank)
            seed_all(s)
            loader.generator.manual_seed(s)
            set_sampler_epoch(sampler, seed=seed, epoch=epoch)
            total, count, step = train_one_epoch(
                ddp=ddp, model=model, loader=loader, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
                criterion=criterion, mixup=mixup, ema=ema, device=device, amp_dtype=amp_dtype,
                clip=opt["clip_grad"], clip_mode=opt["clip_mode"], step=step, epoch=epoch, num_epochs=num_epochs,
                log_period=max(int(train["log_period"]), 1), timer=timer, writer=writer,
                stop_requested=watch.requested)
            train_loss = _mean_over_processes(total, count)
            done = epoch + 1
            if done == num_epochs or done % eval_period == 0:
                result = evaluate(model, datasets.val, device=device, batch_size=eval_batch,
                                  workers=int(train["workers"]), amp_dtype=amp_dtype)
                record = {"kind": "cls", "iteration": step, "epoch": done, **result.summary(),
                          "train_loss": train_loss, "lr": _current_lr(optimizer), **meta}
                if ema is not None:
                    record["ema"] = evaluate(ema.module, datasets.val, device=device, batch_size=eval_batch,
                                             workers=int(train["workers"]), amp_dtype=amp_dtype).summary()
                logger.info(f"epoch {done}/{num_epochs}: top-1 {record['top1']:.2f}%  top-5 {record['top5']:.2f}%  "
                            f"eval loss {record['eval_loss']:.4f}  train loss {train_loss:.4f}"
                            + (f"  (EMA top-1 {record['ema']['top1']:.2f}%)" if ema is not None else ""))
                if main:
                    results.add(record)
                    writer.write(step, {f"eval/{k}": record[k] for k in ("top1", "top5", "eval_loss")}, json_line=False)
                    if done == num_epochs:
                        atomic_write(os.path.join(run_dir, PREDICTIONS_FILENAME), json.dumps(result.predictions(done)))
                last_record = record
            if main:
                state = {"epoch": done, "step": step, "num_epochs": num_epochs, "steps_per_epoch": steps_per_epoch,
                         "model": model.state_dict(), "ema": ema.module.state_dict() if ema is not None else None,
                         "optimizer": optimizer.state_dict(),
                         "scheduler": scheduler.state_dict() if scheduler is not None else None,
                         "scaler": scaler.state_dict() if scaler.is_enabled() else None,
                         "rng": rng_state(),
                         "identity": identity}
                atomic_torch_save(state, checkpoint_path(run_dir, done))
                prune_checkpoints(run_dir, keep=1)
            comm.synchronize()
    except Preempted:
        if main:  # it resumes from its last epoch checkpoint: epochs are the unit of exact resume
            atomic_write(os.path.join(run_dir, PREEMPTED_FILENAME), f"epoch checkpoint {epoch}")
        raise
    except Exception as e:
        note_failure(run_dir, e, rank=rank, iteration=getattr(e, "step", step), epoch=epoch)
        raise
    finally:
        if writer is not None:
            writer.close()
    # Parameters (and EMA weights) must agree; unsynchronized BatchNorm statistics differ per process
    # (the evaluation and the saved weights use rank 0's).
    _check_replicas(replica_fingerprint(model), "final")
    if ema is not None:
        _check_replicas(replica_fingerprint(ema.module), "final EMA")

    if main:
        final = ema.module if ema is not None else model
        payload = {"format": FINAL_FORMAT, "model": final.state_dict(), "weights": "ema" if ema is not None else "model",
                   "timm_model": nodes["model"]["name"], "model_kwargs": dict(nodes["model"]["kwargs"] or {}),
                   "num_classes": int(data["num_classes"]), "img_size": int(data["img_size"]), "arm": spec.arm,
                   "seed": seed, "lr_scale": float(run.lr_scale), "epoch": num_epochs, "iteration": step,
                   "classes": datasets.classes,
                   "data_config": {k: (list(v) if isinstance(v, tuple) else v)
                                   for k, v in data_config(data, model).items()}}
        save_final(payload, run_dir)
        logger.info(f"Final weights ({payload['weights']}) written to {os.path.join(run_dir, FINAL_FILENAME)} and "
                    f"{FINAL_SAFETENSORS}")
    comm.synchronize()
    return last_record


def evaluate_checkpoint(cfg, *, run: RunSpec, run_dir: str, checkpoint: str, config_file: Optional[str],
                        trust_pickle: bool = False) -> dict:
    """Evaluate the weights of a ``model_final.{safetensors,pth}`` or epoch checkpoint; adds a ``"cls_eval"``
    record to ``run_dir``."""
    comm = _comm()
    setup_logging(run_dir, rank=comm.get_rank())
    data, train = node(cfg, "data"), node(cfg, "train")
    device = _device(train)
    state = load_checkpoint(checkpoint, trust_pickle=trust_pickle)
    if not isinstance(state, dict) or "model" not in state:
        raise UsageError(f"{checkpoint} holds no 'model' state dict")
    model = create_classifier(node(cfg, "model"), int(data["num_classes"]))
    model.load_state_dict(state["model"])
    datasets = build_datasets(data)
    set_transforms(datasets, data=data, augment=node(cfg, "augment"), model=model)
    model.to(device)
    batch = int(train["eval_batch_size"] or max(1, int(1.5 * int(train["batch_size"]) // comm.get_world_size())))
    result = evaluate(model, datasets.val, device=device, batch_size=batch, workers=int(train["workers"]),
                      amp_dtype=_amp_dtype(train, device))
    record = {"kind": "cls_eval", "iteration": int(state.get("iteration", state.get("step", 0))),
              "epoch": int(state.get("epoch", 0)), **result.summary(), "checkpoint": os.path.abspath(checkpoint),
              "weights": state.get("weights", "model"), "arm": state.get("arm", run.arm),
              "seed": int(state.get("seed", run.seed)), "lr_scale": float(run.lr_scale), "config": config_file}
    logger.info(f"{checkpoint}: top-1 {record['top1']:.2f}%  top-5 {record['top5']:.2f}%  "
                f"eval loss {record['eval_loss']:.4f}")
    if comm.is_main_process():
        ResultsFile(run_dir).add(record)
    return record
