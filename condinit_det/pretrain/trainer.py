"""One pretraining run (:class:`PretrainRun`): the armed classifier trained epoch by epoch, evaluated, checkpointed
and exported. Every RNG is re-seeded from (seed, epoch, rank) every epoch, so a run resumed at an epoch boundary
continues exactly as an uninterrupted one. Detail: docs/pretraining.md#a-pretraining-run.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from typing import Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn as nn
from detectron2.utils import comm
from detectron2.utils.env import seed_all_rng
from torch.utils.data import DataLoader

from ..records.environment import environment_record
from ..records.failures import note_failure
from ..records.identity import write_arm_report
from ..records.per_image import write_classification_eval
from ..records.results import METRICS_FILENAME, ResultsFile, truncate_metrics
from ..stage import PRETRAIN
from ..tracking import tracker_writers
from ..utils.checkpoint_io import PRETRAIN_FORMAT, load_checkpoint
from ..utils.distributed import check_replicas
from ..utils.errors import UsageError
from ..utils.fileio import atomic_write, remove_stale_temp_files
from ..utils.logs import ETAPrinter, restore_scalar_history, run_logging, scalar_history
from ..utils.preemption import Preempted, PreemptionWatch
from .checkpoint import (
    FINAL_FILENAME,
    FINAL_SAFETENSORS,
    EpochCheckpointer,
    last_checkpoint,
    periodic_checkpointer,
    save_final,
)
from .conditioning import EpochConditioning, conditioning_options, fixed_batch
from .config import DEFAULTS, arm_spec, node, run_identity
from .data import build_datasets, build_train_sampler, data_config, set_transforms
from .evaluate import evaluate
from .model import build_armed_model, create_classifier
from .step import PretrainStep, current_lr

PREDICTIONS_FILENAME = "eval_predictions.json"
_SEED_STRIDE = 1_000_003  # the sampler's "epoch" is seed * _SEED_STRIDE + epoch
logger = logging.getLogger("condinit_det.pretrain")


def _device(train: Dict) -> Tuple[torch.device, Optional[torch.dtype]]:
    """This process's device and its autocast dtype (None: float32; AMP is CUDA only)."""
    kind, dtypes = str(train["device"]), {"float16": torch.float16, "bfloat16": torch.bfloat16}
    if kind not in ("cpu", "cuda") and not kind.startswith("cuda:"):
        raise UsageError(f"train.device={kind!r}; accepted: cuda, cpu")
    if kind.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError("train.device='cuda' but no CUDA device is available; pass train.device=cpu")
    if train["amp_dtype"] not in dtypes:
        raise UsageError(f"train.amp_dtype={train['amp_dtype']!r}; accepted: {', '.join(dtypes)}")
    if kind == "cpu":
        return torch.device("cpu"), None
    return torch.device("cuda", comm.get_local_rank()), dtypes[train["amp_dtype"]] if train["amp"] else None


def rng_state() -> Dict[str, torch.Tensor]:
    """The global RNG states as tensors, so that an epoch checkpoint loads weights-only: python's and numpy's words
    (with numpy's position last) and torch's CPU state. A record only: every epoch re-seeds every RNG."""
    _, words, _ = random.getstate()
    _, keys, pos, _, _ = np.random.get_state()
    return {
        "python": torch.tensor(words, dtype=torch.int64),
        "numpy": torch.from_numpy(np.append(keys.astype(np.int64), pos)),
        "torch": torch.get_rng_state(),
    }


class PretrainRun:
    """One pretraining run in this process (every process of the run builds one): :meth:`setup`, :meth:`resume` from
    an epoch checkpoint, then :meth:`train`, which ends with :meth:`export`.

    Args:
        config_file: the config's path or ``zoo:`` name, recorded in every record.
        trust_pickle: let :meth:`resume` load an epoch checkpoint that needs full unpickling.
    """

    def __init__(self, cfg, run_dir: str, *, config_file: Optional[str], trust_pickle: bool = False):
        self.cfg, self.run_dir, self.trust_pickle = cfg, run_dir, trust_pickle
        self.nodes = {name: node(cfg, name) for name in DEFAULTS}
        self.train_node = self.nodes["train"]
        self.seed = int(self.train_node["seed"])
        self.lr_scale = float(self.train_node["lr_scale"])
        self.spec = arm_spec(cfg, self.seed)
        self.identity = run_identity(cfg)
        self.rank, self.world = comm.get_rank(), comm.get_world_size()
        self.main = self.rank == 0
        self.device, self.amp_dtype = _device(self.train_node)
        self.meta = dict(
            stage=PRETRAIN.name, arm=self.spec.arm, seed=self.seed, lr_scale=self.lr_scale, config=config_file
        )
        self.analysis = conditioning_options(cfg)  # checked on every process; the main one measures
        self.epoch, self.step = 0, 0  # completed epochs and optimizer steps
        self.history = {}  # what the writers smooth over, from the checkpoint resumed
        self.eval_seconds = []  # how long each evaluation took

    def setup(self) -> None:
        """Model (from the training seed, identical on every process) and arm; data; the step; the checkpointers."""
        data, augment, train = (self.nodes[k] for k in ("data", "augment", "train"))
        if self.main:
            os.makedirs(self.run_dir, exist_ok=True)
            remove_stale_temp_files(self.run_dir)
        comm.synchronize()
        logger.info(
            f"Run {self.run_dir}: arm {self.spec.arm}, seed {self.seed}, lr scale {self.lr_scale:g}, "
            f"{self.world} process(es), device {self.device}"
            + (f", AMP {str(self.amp_dtype).split('.')[-1]}" if self.amp_dtype else "")
        )
        seed_all_rng(self.seed)
        self.model, report = build_armed_model(self.nodes["model"], int(data["num_classes"]), self.spec)
        digest = check_replicas(self.model, "at initialization")
        logger.info(f"{report.summary()}; initial weights sha1 {digest[:12]}")
        if self.main:
            write_arm_report(
                self.run_dir, {**report.to_dict(), "stage": "pretrain", "initial_state_sha1": digest}, self.identity
            )

        self.datasets = build_datasets(data)
        set_transforms(self.datasets, data=data, augment=augment, model=self.model)
        self.model.to(self.device)
        self.batch = int(train["batch_size"]) // self.world
        self.sampler = build_train_sampler(self.datasets.train, augment, world_size=self.world, rank=self.rank)
        self.loader = DataLoader(
            self.datasets.train,
            batch_size=self.batch,
            sampler=self.sampler,
            num_workers=int(train["workers"]),
            pin_memory=self.device.type == "cuda",
            drop_last=True,
            generator=torch.Generator(),  # seeds the workers: re-seeded every epoch
        )
        self.steps_per_epoch = len(self.loader)
        if self.steps_per_epoch == 0:
            raise UsageError(
                f"{len(self.datasets.train)} training images give no full batch of {self.batch} per process"
            )
        self.optimization = PretrainStep(
            self.model,
            self.nodes,
            num_classes=len(self.datasets.classes),
            amp_dtype=self.amp_dtype,
            steps_per_epoch=self.steps_per_epoch,
            lr_scale=self.lr_scale,
        )
        self.num_epochs = self.optimization.num_epochs
        self.ema = self.optimization.ema
        self.conditioning = None
        if self.analysis is not None and self.main:  # the first evaluation images, read once
            batch = fixed_batch(self.datasets.val, self.analysis["num_images"]).to(self.device)
            self.conditioning = EpochConditioning(batch, self.analysis, num_epochs=self.num_epochs, meta=self.meta)
        self.checkpointer = EpochCheckpointer(
            self.model,
            self.run_dir,
            trust_pickle=self.trust_pickle,
            save_to_disk=self.main,
            **self.optimization.checkpointables(),
        )
        self.periodic = periodic_checkpointer(self.checkpointer, keep=1)
        logger.info(
            f"{len(self.datasets.train)} training / {len(self.datasets.val)} evaluation images, "
            f"{len(self.datasets.classes)} classes ({self.datasets.root}); {self.num_epochs} epochs x "
            f"{self.steps_per_epoch} steps of {self.batch} x {self.world}; lr {self.optimization.lr:.4g}"
        )

    def resume(self, path: str) -> None:
        """Continue from an epoch checkpoint: weights, EMA, optimizer, scheduler, scaler, epoch, step and the history
        the writers smooth over."""
        state = self.checkpointer.load(path, checkpointables=list(self.checkpointer.checkpointables))
        if state.get("steps_per_epoch") != self.steps_per_epoch or state.get("num_epochs") != self.num_epochs:
            raise UsageError(
                f"{path} was written with {state.get('num_epochs')} epochs x "
                f"{state.get('steps_per_epoch')} steps, this run has {self.num_epochs} x "
                f"{self.steps_per_epoch}; resume with the same data, batch size and schedule"
            )
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
        self.history = state.get("history", {})
        logger.info(f"Resumed from {path}: {self.epoch} epoch(s), {self.step} step(s) done")

    def train(self) -> None:
        """Train the remaining epochs, then :meth:`export`."""
        from detectron2.utils.events import EventStorage, JSONWriter, TensorboardXWriter

        if self.optimization.scheduler is not None:
            self.optimization.scheduler.step_update(num_updates=self.step)
        self.ddp = self.model
        if self.world > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        self.writers, self.trackers = [], []
        if self.main:
            # the lines after the epoch checkpoint resumed; a fresh start keeps none (its step 0 line is its own)
            truncate_metrics(self.run_dir, max_iteration=self.step if self.epoch else -1)
            self.writers = [
                ETAPrinter(self.num_epochs * self.steps_per_epoch + 1, self._evaluations_left),
                JSONWriter(os.path.join(self.run_dir, METRICS_FILENAME)),
                TensorboardXWriter(self.run_dir, purge_step=self.step),
            ]
            self.trackers = tracker_writers(
                self.cfg,
                self.run_dir,
                stage=PRETRAIN.name,
                exclude=("eval/",),
                params={**self.meta, "identity": self.identity},
            )  # evaluations: per epoch
            self.writers += self.trackers  # W&B / MLflow
        self.results = ResultsFile(self.run_dir)
        environment = environment_record(self.step, device=str(self.device))
        logger.info(
            "Environment: " + ", ".join(f"{k} {v}" for k, v in environment.items() if k not in ("kind", "iteration"))
        )
        self.results.add(environment)  # by the main process, as every ResultsFile write
        self.watch = PreemptionWatch()
        try:
            with EventStorage(start_iter=self.step) as self.storage:
                restore_scalar_history(self.storage, self.history)
                if self.conditioning is not None:
                    self.conditioning.start(
                        self.model, epoch=self.epoch, step=self.step, storage=self.storage, results=self.results
                    )
                for epoch in range(self.epoch, self.num_epochs):
                    self.train_epoch(epoch)
                    done = epoch + 1
                    if self.conditioning is not None and self.conditioning.due(done):
                        self.conditioning.measure(
                            self.model, epoch=done, step=self.step, storage=self.storage, results=self.results
                        )
                    if done == self.num_epochs or done % max(int(self.train_node["eval_period"]), 1) == 0:
                        self.evaluate(done)
                    self._write()  # the epoch's last step (and its evaluation) on one line
                    if self.main:  # the epoch checkpoint: the model, the checkpointables and the training state
                        self.periodic.step(
                            epoch,
                            epoch=done,
                            step=self.step,
                            num_epochs=self.num_epochs,
                            steps_per_epoch=self.steps_per_epoch,
                            rng=rng_state(),
                            history=scalar_history(self.storage),
                            identity=self.identity,
                        )
                    comm.synchronize()
                    self.epoch = done
        finally:
            for writer in self.writers:
                writer.close()
        self.export()

    def _evaluations_left(self, step: int) -> float:
        """Seconds the evaluations after ``step`` completed steps will take, at the mean of those made so far."""
        period, done = max(int(self.train_node["eval_period"]), 1), step // self.steps_per_epoch
        count = sum(1 for e in range(done + 1, self.num_epochs + 1) if e % period == 0 or e == self.num_epochs)
        return count * sum(self.eval_seconds) / len(self.eval_seconds) if self.eval_seconds else 0.0

    def _write(self) -> None:
        for writer in self.writers:
            writer.write()

    def start_epoch(self, epoch: int) -> None:
        """Re-seed every RNG from ``(seed, epoch, rank)`` and the sampler from ``(seed, epoch)``."""
        s = int(np.random.SeedSequence([self.seed, epoch, self.rank]).generate_state(1)[0])
        seed_all_rng(s)  # augmentation, mixup, drop path
        self.loader.generator.manual_seed(s)
        # both samplers shuffle with manual_seed(epoch): the orders of different seeds never meet
        self.sampler.set_epoch(self.seed * _SEED_STRIDE + epoch)

    def train_epoch(self, epoch: int) -> None:
        """One epoch of optimizer steps; keeps the mean training loss over the processes."""
        self.start_epoch(epoch)
        self.ddp.train()
        log_period = max(int(self.train_node["log_period"]), 1)
        total, count = 0.0, 0
        end = time.perf_counter()
        for i, (images, targets) in enumerate(self.loader):
            if self.watch.requested():  # it resumes from its last epoch checkpoint: the unit of exact resume
                self.watch.stop(
                    self.run_dir, f"epoch checkpoint {epoch} (stopped in epoch {epoch + 1}, step {self.step})"
                )
            data_time = time.perf_counter() - end
            images = images.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            value = self.optimization(self.ddp, images, targets, step=self.step + 1)
            self.step += 1
            if not math.isfinite(value):  # train_run records the failure at this step (self.step)
                raise FloatingPointError(
                    f"loss became {value} at step {self.step} (epoch {epoch + 1}); lower the learning rate "
                    "(--lr-scale) or enable gradient clipping (optimizer.clip_grad)"
                )
            total += value
            count += 1
            self.storage.iter = self.step
            self.storage.put_scalars(total_loss=value, time=time.perf_counter() - end, data_time=data_time)
            self.storage.put_scalars(
                lr=current_lr(self.optimization.optimizer),
                epoch=epoch + (i + 1) / self.steps_per_epoch,
                smoothing_hint=False,
            )
            if self.step % log_period == 0 and i + 1 < self.steps_per_epoch:
                self._write()
            end = time.perf_counter()
        parts = comm.all_gather((total, count))  # the mean over the processes
        self.train_loss = sum(t for t, _ in parts) / sum(c for _, c in parts)

    def evaluate(self, done: int) -> None:
        """Evaluate after ``done`` epochs (also the EMA weights); the main process adds the ``"cls"`` record."""
        train, started = self.train_node, time.perf_counter()
        eval_batch = int(train["eval_batch_size"] or max(1, int(1.5 * self.batch)))
        kwargs = dict(
            device=self.device, batch_size=eval_batch, workers=int(train["workers"]), amp_dtype=self.amp_dtype
        )
        result = evaluate(self.model, self.datasets.val, **kwargs)
        record = {
            "kind": "cls",
            "iteration": self.step,
            "epoch": done,
            **result.summary(),
            "train_loss": self.train_loss,
            "lr": current_lr(self.optimization.optimizer),
            **self.meta,
        }
        if self.ema is not None:
            record["ema"] = evaluate(self.ema.module, self.datasets.val, **kwargs).summary()
        logger.info(
            f"epoch {done}/{self.num_epochs}: top-1 {record['top1']:.2f}%  top-5 {record['top5']:.2f}%  "
            f"eval loss {record['eval_loss']:.4f}  train loss {self.train_loss:.4f}"
            + (f"  (EMA top-1 {record['ema']['top1']:.2f}%)" if self.ema is not None else "")
        )
        if self.main:  # the per-image correctness the report resamples, for every evaluation
            path = write_classification_eval(
                self.run_dir, done, labels=result.labels, top1=result.top1, top5_hit=result.top5_hit
            )
            record["per_image"] = os.path.relpath(path, self.run_dir)
            self.results.add(record)
            metrics = {f"eval/{k}": record[k] for k in ("top1", "top5", "eval_loss")}
            self.storage.put_scalars(**metrics, smoothing_hint=False)
            metrics["eval/train_loss"] = self.train_loss
            metrics.update({f"eval/ema_{k}": v for k, v in record.get("ema", {}).items()})
            for writer in self.trackers:  # W&B / MLflow, with the epoch as the step
                writer.log(metrics, step=done, step_name="epoch")
            if done == self.num_epochs:
                predictions = {
                    "epoch": done,
                    "labels": result.labels.tolist(),
                    "top1": result.top1.tolist(),
                    "top5_hit": result.top5_hit.astype(int).tolist(),
                }
                atomic_write(os.path.join(self.run_dir, PREDICTIONS_FILENAME), json.dumps(predictions))
        self.eval_seconds.append(time.perf_counter() - started)

    def export(self) -> None:
        """Check the replicas (not their BatchNorm statistics: rank 0's are saved), then write the final weights."""
        check_replicas(self.model, "at the end")
        if self.ema is not None:
            check_replicas(self.ema.module, "at the end (EMA weights)")
        if self.main:
            final = self.ema.module if self.ema is not None else self.model
            data, model = self.nodes["data"], self.nodes["model"]
            payload = {
                "format": PRETRAIN_FORMAT,
                "model": final.state_dict(),
                "weights": "ema" if self.ema is not None else "model",
                "timm_model": model["name"],
                "model_kwargs": dict(model["kwargs"] or {}),
                "num_classes": int(data["num_classes"]),
                "img_size": int(data["img_size"]),
                "arm": self.spec.arm,
                "seed": self.seed,
                "lr_scale": self.lr_scale,
                "epoch": self.num_epochs,
                "iteration": self.step,
                "classes": self.datasets.classes,
                "data_config": {
                    k: (list(v) if isinstance(v, tuple) else v) for k, v in data_config(data, self.model).items()
                },
            }
            save_final(payload, self.run_dir)
            logger.info(
                f"Final weights ({payload['weights']}) written to "
                f"{os.path.join(self.run_dir, FINAL_FILENAME)} and {FINAL_SAFETENSORS}"
            )
        comm.synchronize()


def train_run(cfg, *, run_dir: str, config_file: Optional[str], resume: bool, trust_pickle: bool = False) -> None:
    """Train one run into ``run_dir`` in every process (``resume``: from its last epoch checkpoint); a failure leaves
    a note for the launcher and is re-raised."""
    run_logging(run_dir, rank=comm.get_rank())
    run = PretrainRun(cfg, run_dir, config_file=config_file, trust_pickle=trust_pickle)
    run.setup()
    path = last_checkpoint(run_dir) if resume else None
    if path:
        run.resume(path)
    try:
        run.train()
    except Preempted:
        raise
    except Exception as e:
        if note_failure(run_dir, e, rank=run.rank, iteration=run.step, epoch=run.epoch):
            logger.exception(f"Run {run_dir} failed:")  # the traceback, in the run's log
        raise
    _log_end(run_dir)


def _log_end(run_dir: str) -> None:
    logger.info(f"Run ended at {time.strftime('%Y-%m-%d %H:%M:%S')}; results in {ResultsFile(run_dir).path}")


def evaluate_checkpoint(
    cfg, *, run_dir: str, checkpoint: str, config_file: Optional[str], trust_pickle: bool = False
) -> dict:
    """Evaluate the weights of a final or epoch checkpoint into a ``"cls_eval"`` record of ``run_dir``."""
    run_logging(run_dir, rank=comm.get_rank())
    data, train = node(cfg, "data"), node(cfg, "train")
    device, amp_dtype = _device(train)
    state = load_checkpoint(checkpoint, trust_pickle=trust_pickle)
    if not isinstance(state, dict) or "model" not in state:
        raise UsageError(f"{checkpoint} holds no 'model' state dict")
    model = create_classifier(node(cfg, "model"), int(data["num_classes"]))
    model.load_state_dict(state["model"])
    datasets = build_datasets(data)
    set_transforms(datasets, data=data, augment=node(cfg, "augment"), model=model)
    model.to(device)
    batch = int(train["eval_batch_size"] or max(1, int(1.5 * int(train["batch_size"]) // comm.get_world_size())))
    result = evaluate(
        model, datasets.val, device=device, batch_size=batch, workers=int(train["workers"]), amp_dtype=amp_dtype
    )
    seed = int(train["seed"])
    # A final file counts its steps in "iteration" and names its arm; an epoch checkpoint counts them in "step" (its
    # "iteration" is fvcore's epoch index) and names its arm in its run identity.
    steps = state.get("step", state.get("iteration", 0))
    arm = state.get("arm") or (state.get("identity") or {}).get("arm")
    if not arm:
        arm = arm_spec(cfg, seed).arm
        logger.info(f"{checkpoint} does not name its arm: recorded under the config's arm '{arm}'")
    record = {
        "kind": "cls_eval",
        "stage": PRETRAIN.name,
        "iteration": int(steps),
        "epoch": int(state.get("epoch", 0)),
        **result.summary(),
        "checkpoint": os.path.abspath(checkpoint),
        "weights": state.get("weights", "model"),
        "arm": arm,
        "seed": int(state.get("seed", seed)),
        "lr_scale": float(train["lr_scale"]),
        "config": config_file,
    }
    logger.info(
        f"{checkpoint}: top-1 {record['top1']:.2f}%  top-5 {record['top5']:.2f}%  eval loss {record['eval_loss']:.4f}"
    )
    ResultsFile(run_dir).add(record)  # by the main process
    _log_end(run_dir)
    return record
