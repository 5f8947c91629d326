"""One detection run in every process: build the armed model, train it with detectron2's trainer, evaluate.

:func:`run` trains (:func:`do_train`: ``SimpleTrainer`` / ``AMPTrainer`` with the project's hooks) or, with
``--eval-only``, evaluates one checkpoint (:func:`do_eval_only`). A training run writes its arm report
(``condinit_arm_report.json``, :func:`condinit_det.records.identity.write_arm_report`): the build's
:class:`~condinit_det.init.InitReport`, the run identity ``--resume`` checks, and per site where its weights finally
came from (``weights_from``: the arm, or the checkpoint that overwrote it). Operational detail: docs/training.md.
"""

import contextlib
import functools
import logging
import os
import time
from typing import Dict, Mapping, Optional, Set

import numpy as np
import torch
from detectron2.config import LazyConfig, instantiate
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.engine import AMPTrainer, SimpleTrainer, hooks
from detectron2.engine.defaults import create_ddp_model
from detectron2.evaluation import inference_on_dataset, print_csv_format
from detectron2.utils import comm
from detectron2.utils.env import seed_all_rng
from detectron2.utils.events import JSONWriter, TensorboardXWriter
from omegaconf import OmegaConf

from ..analysis.hooks import build_conditioning_hook
from ..init import InitReport, find_attention
from ..modeling.arm import rank0_computes_arm
from ..records.environment import environment_record
from ..records.failures import note_failure
from ..records.identity import write_arm_report
from ..records.results import METRICS_FILENAME, ResultsFile, truncate_metrics
from ..stage import DETECTION, PRETRAIN, RunOptions
from ..tracking import tracker_writers
from ..utils.distributed import check_replicas, sync_buffers
from ..utils.logs import ETAPrinter
from ..utils.preemption import Preempted
from .checkpoint import RunCheckpointer, pretrain_checkpoint_file
from .config import arm_spec, dataset_names, run_identity
from .data import StepSeeds, instantiate_train_loader
from .hooks import APHook, PreemptionHook, WriterHistory, ap_record, build_best_checkpointer, continue_writers

__all__ = ["PREDICTIONS_FIGURE", "do_test", "final_recorded", "run", "save_predictions_figure", "weights_from"]

logger = logging.getLogger("detectron2")

PREDICTIONS_FIGURE = "predictions.png"
_MARGIN = ((2, 2), (2, 2), (0, 0))  # white pixels around each panel of the figure


def _setup(cfg, options: RunOptions) -> dict:
    """detectron2's ``default_setup`` without colours and environment dump in log.txt: the logs, ``config.yaml``, the
    RNGs seeded from ``train.seed`` + the rank; returns the ``"environment"`` record, named in the log."""
    output_dir, rank = cfg.train.output_dir, comm.get_rank()
    if comm.is_main_process():
        os.makedirs(output_dir, exist_ok=True)
        LazyConfig.save(cfg, os.path.join(output_dir, "config.yaml"))
    seed_all_rng(int(cfg.train.seed) + rank)
    torch.backends.cudnn.benchmark = bool(cfg.train.get("cudnn_benchmark", False)) and not options.eval_only
    environment = environment_record(0, device=str(cfg.train.device))
    shown = ", ".join(f"{key} {value}" for key, value in environment.items() if key not in ("kind", "iteration"))
    logger.info(
        f"Process {rank} of {comm.get_world_size()}, config {options.config_file or '-'} (as run: "
        f"{os.path.join(output_dir, 'config.yaml')}); environment: {shown}"
    )
    return environment


def do_test(cfg, model):
    """Evaluate ``model`` with ``cfg.dataloader.test`` / ``cfg.dataloader.evaluator``."""
    if "evaluator" not in cfg.dataloader:
        logger.warning("cfg.dataloader.evaluator is not set: no evaluation.")
        return {}
    sync_buffers(getattr(model, "module", model))  # every shard scored with the statistics rank 0 saves
    ret = inference_on_dataset(model, instantiate(cfg.dataloader.test), instantiate(cfg.dataloader.evaluator))
    if comm.is_main_process():
        print_csv_format(ret)
    return ret


def _metadata(cfg, config_file):
    return {
        "arm": arm_spec(cfg).arm,
        "seed": int(cfg.train.seed),
        "lr_scale": float(cfg.train.get("lr_scale", 1.0)),
        "config": config_file or None,
    }


def final_recorded(run_dir: str, max_iter: int) -> bool:
    """Whether ``run_dir`` holds an ``"ap"`` evaluation at ``max_iter`` (the run's end)."""
    return any(r["iteration"] >= max_iter for r in ResultsFile(run_dir).records("ap"))


def weights_from(
    report: InitReport, model: torch.nn.Module, loaded: Set[str], checkpoint: str, checkpoint_arm: Optional[str]
) -> Dict[str, str]:
    """Site name -> where its weights came from once ``checkpoint`` was loaded into ``model``: the checkpoint (and the
    arm it was pretrained with, if it names one) for each site of which it set a parameter, else the arm of
    ``report``. ``loaded``: the names of what it set (``RunCheckpointer.loaded``). A warning says how many sites."""
    overwritten = [site.name for site in find_attention(model) if loaded.intersection(site.parameter_names())]
    if overwritten:
        logger.warning(
            f"train.init_checkpoint={checkpoint} holds the attention weights of {len(overwritten)} of "
            f"{len(report.sites)} site(s): they come from the checkpoint"
            + (f" (pretrained with arm '{checkpoint_arm}')" if checkpoint_arm else f", not from the '{report.arm}' arm")
            + "."
        )
    source = f"checkpoint {checkpoint}" + (f" (pretrained with arm {checkpoint_arm})" if checkpoint_arm else "")
    return {s.name: source if s.name in overwritten else f"arm {report.arm}" for s in report.sites}


def _log_arm_report(report: InitReport, provenance: Optional[Mapping[str, str]]) -> None:
    """Log the arm and, per site, the parameters it changed and (``provenance``) where its weights came from."""
    logger.info(
        f"Attention-init arm '{report.arm}' (seed {report.seed}, options {report.options}): "
        f"{len(report.sites)} attention site(s), {len(report.changed_parameters())} parameter(s) changed."
    )
    for s in report.sites:
        origin = f" <- {provenance[s.name]}" if provenance and s.name in provenance else ""
        logger.info(
            f"  {s.name} [{s.kind}] heads={s.num_heads} dh={s.head_dim}: {', '.join(s.changed) or 'unchanged'}{origin}"
        )


def _save_arm_report(output_dir, report, identity, provenance, init_checkpoint) -> None:
    """Write the arm report with the run identity, per site where its weights came from (``provenance``; None: the
    arm) and the ``init_checkpoint`` loaded (or None)."""
    data = report.to_dict()
    for site in data["sites"]:
        site["weights_from"] = (provenance or {}).get(site["name"], f"arm {report.arm}")
    data["init_checkpoint"] = init_checkpoint
    logger.info(f"Arm report saved to {write_arm_report(output_dir, data, identity)}")


def save_predictions_figure(cfg, model, path: str, *, num_images: int = 4, min_score: float = 0.5) -> None:
    """Save as a PNG the first ``num_images`` test images, one row each: the ground truth (left) beside the model's
    boxes and masks of score >= ``min_score`` (right), both drawn by detectron2's ``Visualizer`` with the dataset's
    class names. An image narrower than 256 pixels is drawn enlarged to 256, so that its objects can be seen."""
    from detectron2.data.detection_utils import read_image
    from detectron2.utils.visualizer import Visualizer
    from PIL import Image

    class Drawing(Visualizer):  # class names in white, readable on their black boxes whatever the object's colour
        def draw_text(self, text, position, **kwargs):
            return super().draw_text(text, position, **dict(kwargs, color="white"))

    name = dataset_names(cfg)[-1]
    ground_truth, metadata = {d["file_name"]: d for d in DatasetCatalog.get(name)}, MetadataCatalog.get(name)
    rows = []
    model.eval()
    with torch.no_grad():
        for batch in instantiate(cfg.dataloader.test):
            for inputs, outputs in zip(batch, model(batch)):
                image = read_image(inputs["file_name"], format="RGB")
                scale = max(1.0, 256 / image.shape[1])
                instances = outputs["instances"].to("cpu")
                kept = instances[instances.scores >= min_score]
                truth = Drawing(image, metadata, scale=scale).draw_dataset_dict(ground_truth[inputs["file_name"]])
                found = Drawing(image, metadata, scale=scale).draw_instance_predictions(kept)
                panels = [np.pad(drawn.get_image(), _MARGIN, constant_values=255) for drawn in (truth, found)]
                rows.append(np.concatenate(panels, axis=1))
            if len(rows) >= num_images:
                break
    width = max(row.shape[1] for row in rows[:num_images])
    rows = [np.pad(row, ((0, 0), (0, width - row.shape[1]), (0, 0)), constant_values=255) for row in rows[:num_images]]
    Image.fromarray(np.concatenate(rows)).save(path)


def do_train(options: RunOptions, cfg, environment: dict):
    """Train one run; ``environment`` is recorded at the iteration it starts from. Returns the last evaluation."""
    output_dir = cfg.train.output_dir
    max_iter = int(cfg.train.max_iter)
    metadata = _metadata(cfg, options.config_file)
    identity = run_identity(cfg)
    results_file = ResultsFile(output_dir)
    main_process = comm.is_main_process()

    # DDP broadcasts rank 0's weights when it wraps the model, so only rank 0 computes the arm.
    with rank0_computes_arm() if comm.get_world_size() > 1 else contextlib.nullcontext():
        model = instantiate(cfg.model)  # applies cfg.condinit; model.condinit_report says what it did
    model.to(cfg.train.device)

    cfg.optimizer.params.model = model
    optim = instantiate(cfg.optimizer)

    ddp_model = _distributed(model, cfg)
    # The data loader comes once the iteration it starts from is known.
    trainer = (AMPTrainer if cfg.train.amp.enabled else SimpleTrainer)(ddp_model, None, optim)
    checkpointer = RunCheckpointer(
        ddp_model,
        output_dir,
        optimizer=optim,
        trainer=trainer,
        trust_pickle=options.trust_pickle,
        metadata={**metadata, "stage": DETECTION.name},
    )
    # The hooks whose state the checkpoint holds, registered before it loads.
    writer_history = WriterHistory(os.path.join(output_dir, METRICS_FILENAME))
    trainer.register_hooks(
        [
            hooks.IterationTimer(),
            hooks.LRScheduler(scheduler=instantiate(cfg.lr_multiplier)),
            StepSeeds(int(cfg.train.seed)),
            writer_history,
        ]
    )

    init = pretrain_checkpoint_file(cfg.train.init_checkpoint) if cfg.train.init_checkpoint else ""
    will_resume = options.resume and checkpointer.has_checkpoint()
    checkpointer.resume_or_load(init, resume=options.resume)
    report, pretrain_arm = model.condinit_report, (checkpointer.pretrain_meta or {}).get("arm")
    provenance = None
    if init and not will_resume:
        provenance = weights_from(report, model, checkpointer.loaded, init, pretrain_arm)
    _log_arm_report(report, provenance)
    if main_process and not will_resume:
        _save_arm_report(output_dir, report, identity, provenance, init or None)
    check_replicas(model, "before training")

    # The checkpoint stores the iteration that just finished.
    start_iter = trainer.iter + 1 if will_resume else 0
    if main_process:
        results_file.add({**environment, "iteration": start_iter})
    if start_iter >= max_iter:
        logger.info(f"{output_dir}: training already finished ({max_iter} iterations).")
        results = {}
        if not final_recorded(output_dir, max_iter):
            results = do_test(cfg, ddp_model)
            if main_process:
                results_file.add(ap_record(results, iteration=max_iter, **metadata))
        return results

    trainer.reset_data_loader(functools.partial(instantiate_train_loader, cfg, start=start_iter))
    eval_period = int(cfg.train.eval_period)
    out = OmegaConf.select(cfg, "dataloader.evaluator.output_dir", default=None)  # where it saves its predictions
    ap_hook = APHook(
        eval_period,
        functools.partial(do_test, cfg, ddp_model),
        results_file=results_file,
        metadata=metadata,
        predictions_file=os.path.join(out, "coco_instances_results.json") if out else None,
        ground_truth=MetadataCatalog.get(dataset_names(cfg)[-1]).get("json_file") if out else None,
    )
    writer = None
    if main_process:  # detectron2's default writers, with an ETA that counts the evaluations to come
        # what a stopped run wrote after its checkpoint goes; the new writers continue after what stays
        written = truncate_metrics(output_dir, max_iteration=start_iter - 1, size=writer_history.metrics_size)
        params = {**metadata, "identity": identity}
        writers = [
            ETAPrinter(max_iter, ap_hook.seconds_left),
            JSONWriter(os.path.join(output_dir, METRICS_FILENAME)),
            TensorboardXWriter(output_dir),
            # + W&B / MLflow (the storage counts from iteration 0)
            *tracker_writers(cfg, output_dir, stage=DETECTION.name, params=params, step_offset=1, max_step=max_iter),
        ]
        continue_writers(writers, written)
        writer = hooks.PeriodicWriter(writers, period=cfg.train.log_period)
    # An iteration's evaluation and metrics are written before its checkpoint, which thus covers them.
    trainer.register_hooks(
        [
            ap_hook,
            build_best_checkpointer(eval_period, checkpointer, results_file=results_file) if main_process else None,
            build_conditioning_hook(cfg, config_name=options.config_file or None),
            writer,
            hooks.PeriodicCheckpointer(checkpointer, **cfg.train.checkpointer) if main_process else None,
            PreemptionHook(checkpointer, output_dir),
        ]
    )
    try:
        trainer.train(start_iter, max_iter)
    except Exception as e:
        if not isinstance(e, Preempted):  # a requeue is not a failure
            note_failure(output_dir, e, rank=comm.get_rank(), iteration=trainer.iter)
        raise
    check_replicas(model, "after training")
    if main_process and "evaluator" in cfg.dataloader:
        try:  # a look at what the model finds, never a reason to fail the run
            save_predictions_figure(cfg, model, os.path.join(output_dir, PREDICTIONS_FIGURE))
        except Exception as e:  # noqa: BLE001
            logger.warning(f"{PREDICTIONS_FIGURE} not drawn ({type(e).__name__}: {e})")
    return ap_hook.last_results


def _distributed(model, cfg):
    """``model`` wrapped as ``cfg.train.ddp`` says (over CPU modules: gloo) when there are several processes; the
    wrapping broadcasts rank 0's weights, so every process holds the same ones."""
    ddp = dict(cfg.train.ddp)
    if str(cfg.train.device).startswith("cpu"):
        ddp["device_ids"] = None
    return create_ddp_model(model, **ddp)


def do_eval_only(options: RunOptions, cfg):
    """Evaluate ``train.init_checkpoint`` (with --resume: the run's last checkpoint) and add an ``"eval"`` record
    under the checkpoint's own arm and stage (the config's arm when the checkpoint names none)."""
    # Each process evaluates its share of the test set, with the same weights: rank 0's where the checkpoint has none
    # (the detection heads of a pretraining checkpoint), which every process draws from its own seed.
    model = _distributed(instantiate(cfg.model).to(cfg.train.device), cfg)
    checkpointer = RunCheckpointer(model, cfg.train.output_dir, trust_pickle=options.trust_pickle)
    path = cfg.train.init_checkpoint
    if options.resume and checkpointer.has_checkpoint():
        path = checkpointer.get_checkpoint_file()
    extra = checkpointer.load(path)
    check_replicas(model, "before evaluation")
    results = do_test(cfg, model)
    if comm.is_main_process() and results:
        metadata = _metadata(cfg, options.config_file)
        origin = checkpointer.pretrain_meta or extra
        if origin.get("arm"):
            metadata["arm"] = origin["arm"]
        else:
            logger.info(f"{path} does not name its arm: recorded under the config's arm '{metadata['arm']}'")
        iteration = extra.get("iteration")
        record = ap_record(results, iteration=0 if iteration is None else int(iteration) + 1, kind="eval", **metadata)
        record.update(
            stage=PRETRAIN.name if checkpointer.pretrain_meta else extra.get("stage", DETECTION.name), checkpoint=path
        )
        ResultsFile(cfg.train.output_dir).add(record)
    return results


def run(options: RunOptions, cfg) -> dict:
    """Train (or with ``options.eval_only`` evaluate) one run as ``cfg`` says, in this process (every process of
    the run calls it). Returns the last evaluation's results."""
    environment = _setup(cfg, options)
    results = do_eval_only(options, cfg) if options.eval_only else do_train(options, cfg, environment)
    logger.info(
        f"Run ended at {time.strftime('%Y-%m-%d %H:%M:%S')}; results in {ResultsFile(cfg.train.output_dir).path}"
    )
    return results
