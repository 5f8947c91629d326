"""
Training and evaluation entry points behind ``tools/train_net.py``.

Lazy (``.py``) configs follow detectron2's ``tools/lazyconfig_train_net.py`` conventions and
read: ``model`` (armed: :func:`condinit_det.modeling.armed`), ``optimizer``, ``lr_multiplier``,
``dataloader.{train,test,evaluator}``, ``train.{output_dir, init_checkpoint, max_iter,
eval_period, log_period, checkpointer, ddp, amp.enabled, device, seed}``, ``condinit`` (the arm,
``configs/common/condinit.py``) and the optional ``condinit_analysis`` (conditioning analysis
hook; ``period=0`` or absent: off). yacs (``.yaml``) configs take the ``DefaultTrainer`` path
with the project's keys added by ``condinit_det.modeling.yacs_config.add_condinit_config``.

Seeds: a negative ``train.seed`` (detectron2's "random") is replaced by 0, so that separate
runs of different arms share data order and every non-attention weight; ``--seeds`` or
``train.seed=N`` choose others, and the arm's seed follows the training seed.

Every run trains into ``<output_dir>/<arm>/seed<k>[-lr<s>]/`` (:mod:`condinit_det.records.layout`), the
same place in both stages, whether it is one run or an *experiment* (``--arm all``, ``--seeds``,
``--lr-scale``: one run per arm, seed and learning-rate scale, then the comparison in
``<output_dir>/report/``). Each run has a launch of its own (:func:`execute`): a run that
diverges or raises is recorded as failed, every process of it stops, and the next run starts.
"""
import argparse
import contextlib
import gc
import inspect
import logging
import os
import tempfile
from typing import List, Optional

import torch
from omegaconf import OmegaConf, open_dict

from detectron2.config import CfgNode, LazyConfig, instantiate
from detectron2.engine import AMPTrainer, SimpleTrainer, default_argument_parser, default_setup, default_writers, hooks
from detectron2.engine.defaults import create_ddp_model
from detectron2.evaluation import inference_on_dataset, print_csv_format
from detectron2.utils import comm

from condinit_det.init.spec import ArmSpec, plain, resolve_arm_node
from condinit_det.utils.checkpoint_io import TRUST_FLAG, check_loadable, refuse_pickle
from condinit_det.utils.distributed import replica_fingerprint, sync_buffers
from condinit_det.init import ARMS
from condinit_det.model_zoo import is_yacs_file, resolve_config_file
from condinit_det.modeling.arm import armed, armed_nodes, check_arm_agrees, rank0_computes_arm, sites_only
from condinit_det.records.results import ResultsFile
from condinit_det.launch.slurm import add_slurm_arguments
from condinit_det.records.layout import ARM_CHOICES, RunSpec, parse_lr_scales, parse_seeds, plan_runs, write_plan
from condinit_det.utils.preemption import Preempted
from condinit_det.records.identity import check_resume_identity, read_arm_report
from condinit_det.launch.experiment import execute_runs
from condinit_det.records.failures import note_failure

from .arm_report import AttentionSnapshot, log_arm_report, save_arm_report, weights_from
from .checkpoint import RunCheckpointer, check_checkpoint_file, pretrain_checkpoint_file, read_pretrain_meta
from .hooks import APHook, PreemptionHook, ap_record, build_best_checkpointer

__all__ = [
    "REPORT_DIRNAME",
    "build_argument_parser",
    "check_invocation",
    "execute",
    "load_config",
    "plan_invocation",
    "prepare_config",
    "build_model",
    "do_test",
    "do_train",
    "run",
    "run_worker",
]

logger = logging.getLogger("detectron2")

REPORT_DIRNAME = "report"
DEFAULT_SEED = 0
INFERENCE_DIRNAME = "inference"

_EPILOG = """
Examples:

Train one arm on one machine (lazy config, CPU):
    $ tools/train_net.py --config-file configs/demo/mask_rcnn_vit_tiny.py --arm conditioned

Every run goes to <output_dir>/<arm>/seed<k>/. Train the three arms, then write the comparison into
<output_dir>/report/ (several seeds; a learning-rate scan on the first seed):
    $ tools/train_net.py --config-file cfg.py --arm all train.output_dir=output/exp1
    $ tools/train_net.py --config-file cfg.py --arm all --seeds 0,1,2 --lr-scale 0.5,1,2 train.output_dir=output/exp1

Resume (finished runs are skipped; a run directory never changes arm, seed or patterns; a diverged run
is not retried, one that failed with an error continues from its last checkpoint):
    $ tools/train_net.py --config-file cfg.py --arm all --resume train.output_dir=output/exp1
Train the failed and diverged runs afresh (their old directories are moved aside to <run>.failed<n>/):
    $ tools/train_net.py --config-file cfg.py --arm all --retry-failed train.output_dir=output/exp1

Fine-tune each arm from its own pretrained backbone:
    $ tools/train_net.py --config-file cfg.py --arm all "train.init_checkpoint='output/pretrain/{arm}/seed{seed}'"

Run on 8 GPUs / on several machines:
    $ tools/train_net.py --num-gpus 8 --config-file cfg.py train.device=cuda
    (machine0)$ tools/train_net.py --machine-rank 0 --num-machines 2 --dist-url <URL> [--other-flags]
    (machine1)$ tools/train_net.py --machine-rank 1 --num-machines 2 --dist-url <URL> [--other-flags]
"""


def build_argument_parser():
    """detectron2's ``default_argument_parser`` plus the arm, seed and learning-rate options."""
    parser = default_argument_parser(epilog=_EPILOG)
    parser.add_argument(
        "--arm", choices=ARM_CHOICES, default=None,
        help="attention-init arm (sets condinit.arm); 'all' trains the three arms with the same seeds into "
        "<output_dir>/<arm>/seed<k>/ and writes <output_dir>/report/. Default: the config's condinit.arm.")
    parser.add_argument(
        "--seeds", default=None, metavar="LIST",
        help="training seeds, e.g. '0,1,2' or '0-2': one run per arm and seed in <output_dir>/<arm>/seed<k>/ "
        "(the arm's seed follows the training seed). Default: the config's train.seed.")
    parser.add_argument(
        "--lr-scale", default=None, metavar="LIST",
        help="multipliers of the config's base learning rate, e.g. '0.5,1,2': runs the other scales for every "
        "arm on the first seed, into <output_dir>/<arm>/seed<k>-lr<s>/.")
    parser.add_argument(
        "--bootstrap", type=int, default=1000, metavar="B",
        help="resamples of the evaluation images for the confidence intervals of a one-seed comparison in the "
        "report written at the end of an experiment (0: none; each arm's predictions are matched once per task, "
        "then every resample is an accumulation)")
    parser.add_argument(
        "--retry-failed", action="store_true",
        help="implies --resume; also train the runs that failed or diverged afresh, moving their old run "
        "directories aside to <run>.failed<n>/ (--resume alone skips a diverged run and continues one that "
        "failed with an error from its last checkpoint)")
    parser.add_argument(
        "--allow-changed-run", action="store_true",
        help="let --resume continue a run directory started with another arm, seed, patterns or lr scale")
    add_slurm_arguments(parser)
    parser.add_argument(
        "--allow-shared-checkpoint", action="store_true",
        help="allow train.init_checkpoint to give an arm weights that are not its own: the same checkpoint "
        "for every arm, or another arm's pretraining checkpoint")
    parser.add_argument(
        TRUST_FLAG, action="store_true",
        help="load checkpoints that need full unpickling (.pkl, e.g. detectron2:// model-zoo files, or .pth "
        "holding objects), which can run code stored in them; only for files from a source you trust")
    return parser


# ---------------------------------------------------------------------------------------------
# Configs: lazy (DictConfig) and yacs (CfgNode)
# ---------------------------------------------------------------------------------------------
def load_config(config_file: str, opts: Optional[List[str]] = None):
    """Load a lazy (.py, or a saved lazy .yaml) or yacs (.yaml) config and apply overrides.

    ``config_file`` is a path or a model-zoo name ``zoo:<name>`` (:mod:`condinit_det.model_zoo`).
    """
    if not config_file:
        raise ValueError("--config-file is required (a lazy .py config or a yacs .yaml config, a path or zoo:<name>).")
    path = resolve_config_file(config_file)
    opts = list(opts or [])
    if is_yacs_file(path):
        from detectron2.config import get_cfg

        from condinit_det.modeling.yacs_config import add_condinit_config

        cfg = get_cfg()
        add_condinit_config(cfg)
        cfg.merge_from_file(path)
        cfg.merge_from_list(opts)
        return cfg
    if not path.endswith((".py", ".yaml", ".yml")):
        raise ValueError(f"Config file {config_file} must end in .py (lazy) or .yaml (yacs or lazy).")
    cfg = LazyConfig.load(path)
    return LazyConfig.apply_overrides(cfg, opts)


def _is_yacs(cfg) -> bool:
    return isinstance(cfg, CfgNode)


def get_output_dir(cfg) -> str:
    return cfg.OUTPUT_DIR if _is_yacs(cfg) else cfg.train.output_dir


def get_max_iter(cfg) -> int:
    return int(cfg.SOLVER.MAX_ITER if _is_yacs(cfg) else cfg.train.max_iter)


def get_seed(cfg) -> int:
    return int(cfg.SEED if _is_yacs(cfg) else cfg.train.get("seed", -1))


def get_lr_scale(cfg) -> float:
    return float(cfg.SOLVER.LR_SCALE if _is_yacs(cfg) else cfg.train.get("lr_scale", 1.0))


def get_device(cfg) -> str:
    return str(cfg.MODEL.DEVICE if _is_yacs(cfg) else cfg.train.device)


def get_init_checkpoint(cfg) -> str:
    return cfg.MODEL.WEIGHTS if _is_yacs(cfg) else cfg.train.get("init_checkpoint", "")


def arm_spec(cfg) -> ArmSpec:
    """The validated arm of a prepared config."""
    if _is_yacs(cfg):
        from condinit_det.modeling.yacs_config import condinit_options

        node = cfg.MODEL.CONDINIT
        return resolve_arm_node({"arm": node.ARM, "seed": node.SEED, "include": list(node.INCLUDE) or None,
                                 "exclude": list(node.EXCLUDE) or None,
                                 "options": {node.ARM: condinit_options(node)} if condinit_options(node) else {}})
    return resolve_arm_node(cfg.condinit)


def run_identity(cfg) -> dict:
    """What a resumed run must share with the run it continues (:data:`condinit_det.records.layout.IDENTITY_KEYS`)."""
    return {**arm_spec(cfg).identity(), "seed": get_seed(cfg), "lr_scale": get_lr_scale(cfg)}


def _format_checkpoint(path: str, arm: str, seed: int) -> str:
    if not path:
        return path
    path = str(path).replace("{arm}", arm).replace("{seed}", str(seed))
    return pretrain_checkpoint_file(path) if os.path.isdir(path) else path


def _check_model_arm(cfg) -> None:
    """The model node applies ``cfg.condinit``: arm it when it is not armed; refuse two disagreeing arms."""
    nodes = armed_nodes(cfg.model)
    if not nodes:
        armed(cfg.model)
        logger.info("cfg.model is not armed: armed it here so this run builds condinit.arm (wrap the model node "
                    "with condinit_det.modeling.armed() so every trainer gets the arm)")
        return
    if len(nodes) > 1:
        raise ValueError(f"the arm is applied in two places ({', '.join(p for p, _ in nodes)}); arm the model once")
    path, node = nodes[0]
    check_arm_agrees(node.condinit, cfg.condinit, where=f"{path}.condinit")


def _check_arm_sites(cfg) -> None:
    """Build the model once with the arm's sites checked and no weight changed (the default arm's
    work): a model without attention, an include/exclude pattern that matches nothing or a head
    count that does not divide the width fails here, before anything is written or launched. The
    global RNG is left as it was."""
    with sites_only(), torch.random.fork_rng(devices=[]), torch.no_grad():
        instantiate(cfg.model)
    gc.collect()


def _set_evaluator_output(cfg, output_dir: str) -> None:
    """Let the evaluator save its predictions (``<run>/inference/``), which the report resamples."""
    node = cfg.dataloader.get("evaluator") if "dataloader" in cfg else None
    if node is None or not OmegaConf.is_dict(node) or node.get("output_dir"):
        return
    target = node.get("_target_")
    try:
        accepts = "output_dir" in inspect.signature(target).parameters
    except (TypeError, ValueError):
        accepts = False
    if accepts:
        node.output_dir = os.path.join(output_dir, INFERENCE_DIRNAME)


def prepare_config(cfg, *, arm: Optional[str] = None, output_dir: Optional[str] = None,
                   seed: Optional[int] = None, lr_scale: float = 1.0):
    """Set the run's arm, output directory, seed and learning-rate scale; resolve ``{arm}`` / ``{seed}``
    in the init checkpoint. Returns cfg (modified in place); raises ValueError on a bad arm node."""
    if arm is not None and arm not in ARMS:
        raise ValueError(f"Unknown arm {arm!r}; accepted: {', '.join(ARMS)}")
    if _is_yacs(cfg):
        cfg.defrost()
        if arm is not None:
            cfg.MODEL.CONDINIT.ARM = arm
        if output_dir is not None:
            cfg.OUTPUT_DIR = output_dir
        if seed is not None:
            cfg.SEED = int(seed)
        if cfg.SEED < 0:
            logger.info(f"SEED={cfg.SEED} (random) replaced by {DEFAULT_SEED} so arms stay comparable.")
            cfg.SEED = DEFAULT_SEED
        cfg.MODEL.CONDINIT.SEED = cfg.SEED
        cfg.SOLVER.LR_SCALE = float(lr_scale)
        cfg.SOLVER.BASE_LR = float(cfg.SOLVER.BASE_LR) * float(lr_scale)
        cfg.MODEL.WEIGHTS = _format_checkpoint(cfg.MODEL.WEIGHTS, cfg.MODEL.CONDINIT.ARM, cfg.SEED)
        cfg.freeze()
        arm_spec(cfg)
        return cfg

    with open_dict(cfg):
        if "condinit" not in cfg or cfg.condinit is None:
            cfg.condinit = OmegaConf.create({"arm": "default", "seed": None, "include": None, "exclude": None,
                                             "options": {}})
        if arm is not None:
            cfg.condinit.arm = arm
        if output_dir is not None:
            cfg.train.output_dir = output_dir
        if seed is not None:
            cfg.train.seed = int(seed)
        if cfg.train.get("seed") is None or cfg.train.seed < 0:
            logger.info(f"train.seed={cfg.train.get('seed')} (random) replaced by {DEFAULT_SEED} so that arms share "
                        "data order and non-attention weights; use --seeds or train.seed=N for others.")
            cfg.train.seed = DEFAULT_SEED
        if cfg.condinit.get("seed") is None or seed is not None:
            cfg.condinit.seed = cfg.train.seed
        cfg.train.lr_scale = float(lr_scale)
        if lr_scale != 1.0:
            cfg.optimizer.lr = float(cfg.optimizer.lr) * float(lr_scale)
        spec = resolve_arm_node(cfg.condinit)
        cfg.train.init_checkpoint = _format_checkpoint(cfg.train.get("init_checkpoint", ""), spec.arm,
                                                       cfg.train.seed)
        _check_model_arm(cfg)
        _set_evaluator_output(cfg, cfg.train.output_dir)
    return cfg


# ---------------------------------------------------------------------------------------------
# Checks before anything is written or launched
# ---------------------------------------------------------------------------------------------
def _dataset_names(cfg) -> List[str]:
    names = []
    for split in ("train", "test"):
        node = cfg.dataloader.get(split) if "dataloader" in cfg else None
        dataset = node.get("dataset") if node is not None and OmegaConf.is_dict(node) else None
        value = dataset.get("names") if dataset is not None and OmegaConf.is_dict(dataset) else None
        value = plain(value)
        names += [value] if isinstance(value, str) else list(value or [])
    return list(dict.fromkeys(names))


def _check_datasets(names: List[str]) -> None:
    from detectron2.data import DatasetCatalog, MetadataCatalog

    registered = DatasetCatalog.list()
    for name in names:
        if name not in registered:
            shown = ", ".join(sorted(registered)[:12])
            raise ValueError(f"dataset {name!r} is not registered; register it (DatasetCatalog.register or "
                             f"register_coco_instances) or use a registered one, e.g. {shown}, ...")
        meta = MetadataCatalog.get(name)
        for key in ("image_root", "json_file"):
            path = meta.get(key, None)
            if path and not os.path.exists(path):
                raise ValueError(
                    f"dataset {name!r}: its {key} {path} does not exist; for the COCO configs set "
                    "DETECTRON2_DATASETS to the folder that holds coco/ (README: COCO configs)")


def _check_writable(output_dir: str) -> None:
    """The output directory exists and takes files, or can be created (nothing is created here)."""
    if not output_dir:
        raise ValueError("the config has no output directory (train.output_dir / OUTPUT_DIR)")
    existing = os.path.abspath(output_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    problem = None
    if not os.path.isdir(existing):
        problem = f"{existing} is not a directory"
    else:
        try:  # a real write (permission bits alone say nothing for root or read-only mounts)
            os.rmdir(tempfile.mkdtemp(prefix=".write-test.", dir=existing))
        except OSError as e:
            problem = e.strerror
    if problem:
        raise ValueError(f"cannot write to the output directory {output_dir} ({problem}); choose another with "
                         "train.output_dir=DIR (OUTPUT_DIR DIR for yacs configs)")


def _checkpoint_to_resume(output_dir: str) -> Optional[str]:
    tag = os.path.join(output_dir, "last_checkpoint")
    if not os.path.isfile(tag):
        return None
    with open(tag) as f:
        name = f.read().strip()
    if not name:
        raise ValueError(f"{tag} is empty; it should name the checkpoint to resume from: write that file name "
                         "into it or delete it to start afresh")
    return os.path.join(output_dir, name)


def check_run(cfg, *, resume: bool, eval_only: bool, allow_changed_run: bool = False,
              allow_shared_checkpoint: bool = False, trust_pickle: bool = False) -> None:
    """Refuse, with one clear error, what would fail later or lose data; changes nothing on disk
    except creating the output directory."""
    output_dir = get_output_dir(cfg)
    spec = arm_spec(cfg)
    if not _is_yacs(cfg):
        _check_datasets(_dataset_names(cfg))
    _check_writable(output_dir)
    if resume:
        ResultsFile(output_dir).records()  # a corrupt results.json raises, and stays as it is
        if not eval_only:
            check_resume_identity(output_dir, run_identity(cfg), allow_change=allow_changed_run)
        last = _checkpoint_to_resume(output_dir)
        if last:
            check_checkpoint_file(last)
            check_loadable(last, trust_pickle=trust_pickle)
    init = get_init_checkpoint(cfg)
    if eval_only and not init and not (resume and _checkpoint_to_resume(output_dir)):
        raise ValueError("--eval-only needs train.init_checkpoint=PATH (MODEL.WEIGHTS for yacs) or --resume in a "
                         "run directory with a checkpoint")
    if init:
        refuse_pickle(init, trust_pickle)  # also detectron2:// and http(s):// .pkl files
    if init and "://" not in init:
        check_checkpoint_file(init.split("?")[0])
        meta = read_pretrain_meta(init, trust_pickle=trust_pickle)
        if meta and meta.get("arm") not in (None, spec.arm) and not (eval_only or allow_shared_checkpoint):
            raise ValueError(
                f"train.init_checkpoint {init} was pretrained with arm {meta.get('arm')!r} but this run's arm is "
                f"{spec.arm!r}; use that arm's checkpoint (e.g. a path with {{arm}}) or pass --allow-shared-checkpoint")


# ---------------------------------------------------------------------------------------------
# Model, evaluation, training (lazy configs)
# ---------------------------------------------------------------------------------------------
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
    if getattr(args, "config_file", ""):  # default_setup prints the file: the one behind a zoo:<name>
        args = argparse.Namespace(**{**vars(args), "config_file": resolve_config_file(args.config_file)})
    default_setup(cfg, args)
    from detectron2.utils.logger import setup_logger

    # The project's own modules (arm report, results) log alongside detectron2's.
    setup_logger(get_output_dir(cfg), distributed_rank=comm.get_rank(), name="condinit_det")


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


def check_replicas(model, when: str) -> None:
    """All ranks hold bitwise identical parameters and synchronized buffers; raises otherwise (no-op in one
    process). The running statistics of unsynchronized BatchNorm layers differ per rank by design: they are
    left out here, and :func:`do_test` gives every rank rank 0's before it evaluates."""
    if comm.get_world_size() == 1:
        return
    prints = comm.all_gather(replica_fingerprint(_unwrap(model)))
    if len(set(prints)) != 1:
        raise RuntimeError(f"replicas differ {when}: fingerprints of parameters and synchronized buffers per rank "
                           f"{prints}")
    logger.info(f"Replica check {when}: all {len(prints)} ranks hold identical weights (sha1 {prints[0][:12]})")


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


def _final_recorded(cfg) -> bool:
    rf = ResultsFile(get_output_dir(cfg))
    return rf.exists() and any(r["iteration"] >= get_max_iter(cfg) for r in rf.records("ap"))


def _build_analysis_hook(cfg, config_file):
    """The conditioning-analysis hook when ``condinit_analysis.period > 0``, else None."""
    node = cfg.get("condinit_analysis")
    if node is None or int(node.get("period", 0) or 0) <= 0:
        return None
    from condinit_det.analysis.hooks import build_conditioning_hook

    return build_conditioning_hook(cfg, config_name=config_file or None)


def _prediction_files(cfg):
    """(path the evaluator writes its COCO predictions to, ground-truth json) or (None, None)."""
    node = cfg.dataloader.get("evaluator")
    out = node.get("output_dir") if node is not None and OmegaConf.is_dict(node) else None
    names = [n for n in _dataset_names(cfg)][-1:]
    if not out or not names:
        return None, None
    from detectron2.data import MetadataCatalog

    return os.path.join(out, "coco_instances_results.json"), MetadataCatalog.get(names[0]).get("json_file", None)


def do_train(args, cfg):
    """Train one arm as configured (lazy config). Returns the last evaluation results."""
    output_dir = cfg.train.output_dir
    max_iter = int(cfg.train.max_iter)
    metadata = _metadata(cfg, args.config_file)
    identity = run_identity(cfg)
    results_file = ResultsFile(output_dir)
    main_process = comm.is_main_process()
    if args.resume:
        check_resume_identity(output_dir, identity, allow_change=getattr(args, "allow_changed_run", False))
    elif main_process:
        old = results_file.archive()
        if old:
            logger.warning(f"Fresh (non --resume) run: previous results moved to {old}")

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
                                   trust_pickle=getattr(args, "trust_pickle", False), metadata=metadata)
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
            _build_analysis_hook(cfg, args.config_file),
            hooks.PeriodicWriter(default_writers(output_dir, max_iter), period=cfg.train.log_period)
            if main_process else None,
        ]
    )

    init = cfg.train.init_checkpoint
    will_resume = args.resume and checkpointer.has_checkpoint()
    snapshot = AttentionSnapshot(model) if init and not will_resume else None
    checkpointer.resume_or_load(init, resume=args.resume)
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
    check_replicas(ddp_model, "before training")

    # The checkpoint stores the iteration that just finished.
    start_iter = trainer.iter + 1 if will_resume else 0
    if start_iter >= max_iter:
        logger.info(f"{output_dir}: training already finished ({max_iter} iterations).")
        if not _final_recorded(cfg):
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
    check_replicas(ddp_model, "after training")
    return last_results


def do_eval_only(args, cfg):
    """
    Evaluate ``train.init_checkpoint`` (or, with --resume, the run's last checkpoint) and add an
    ``"eval"`` record. The checkpoint supplies every weight; the record names the arm of the run
    directory's arm report when there is one.
    """
    model, _ = build_model(cfg)
    model.to(cfg.train.device)
    model = _create_ddp(model, cfg)
    checkpointer = RunCheckpointer(model, cfg.train.output_dir, trust_pickle=getattr(args, "trust_pickle", False))
    path = checkpointer.get_checkpoint_file() if args.resume and checkpointer.has_checkpoint() \
        else cfg.train.init_checkpoint
    if not path:
        raise ValueError("--eval-only needs train.init_checkpoint=PATH (or --resume in a run directory).")
    extra = checkpointer.load(path)
    results = do_test(cfg, model)
    if comm.is_main_process() and results:
        it = extra.get("iteration") if isinstance(extra, dict) else None
        metadata = _metadata(cfg, args.config_file)
        previous = (read_arm_report(cfg.train.output_dir) or {}).get("run") or {}
        metadata["arm"] = previous.get("arm", metadata["arm"])
        record = ap_record(results, iteration=0 if it is None else int(it) + 1, kind="eval", **metadata)
        record["checkpoint"] = path
        ResultsFile(cfg.train.output_dir).add(record)
    return results


# ---------------------------------------------------------------------------------------------
# Process-level entry points (called by detectron2.engine.launch in every worker)
# ---------------------------------------------------------------------------------------------
def run(args, cfg=None):
    """Train (or evaluate) one run; ``cfg`` defaults to the one in ``args``."""
    if cfg is None:
        cfg = prepare_config(load_config(args.config_file, args.opts), arm=args.arm)
    _setup_logging(cfg, args)
    if _is_yacs(cfg):
        from .yacs_trainer import run_yacs

        return run_yacs(args, cfg, run_identity(cfg))
    if args.eval_only:
        return do_eval_only(args, cfg)
    return do_train(args, cfg)


def is_experiment(args) -> bool:
    """Whether the invocation trains several runs (``--arm all``, ``--seeds``, ``--lr-scale``)."""
    return args.arm == "all" or bool(args.seeds) or bool(args.lr_scale)


def _run_config(args, base: str, spec: RunSpec):
    return prepare_config(load_config(args.config_file, args.opts), arm=spec.arm, output_dir=spec.path(base),
                          seed=spec.seed, lr_scale=spec.lr_scale)


def plan_invocation(args, only: Optional[RunSpec] = None):
    """(base output dir, [(RunSpec, prepared cfg)]): one run (``--arm X`` or the config's arm) or an experiment;
    ``only``: that planned run alone (the others' init checkpoints may not exist yet)."""
    base_cfg = prepare_config(load_config(args.config_file, args.opts),
                              arm=None if args.arm in (None, "all") else args.arm)
    base = get_output_dir(base_cfg)
    if not base:
        raise ValueError("the config has no output directory (train.output_dir / OUTPUT_DIR)")
    arms = list(ARMS) if args.arm == "all" else [arm_spec(base_cfg).arm]
    seeds = parse_seeds(args.seeds) if args.seeds else [get_seed(base_cfg)]
    scales = parse_lr_scales(args.lr_scale) if args.lr_scale else [1.0]
    specs = [spec for spec in plan_runs(arms, seeds, scales) if only is None or spec == only]
    return base, [(spec, _run_config(args, base, spec)) for spec in specs]


def check_invocation(args) -> None:
    """Everything that can be checked before launching workers; raises ValueError / FileNotFoundError."""
    if args.eval_only and is_experiment(args):
        raise ValueError("--eval-only evaluates one checkpoint; it cannot be combined with --arm all, --seeds or "
                         "--lr-scale")
    if getattr(args, "retry_failed", False) or getattr(args, "slurm", False):
        args.resume = True  # a submission continues what exists: resubmitting is always safe
    if getattr(args, "slurm", False) and args.eval_only:
        raise ValueError("--slurm submits training runs; run --eval-only directly")
    kwargs = dict(resume=args.resume, eval_only=args.eval_only, allow_changed_run=args.allow_changed_run,
                  allow_shared_checkpoint=args.allow_shared_checkpoint, trust_pickle=args.trust_pickle)
    _, runs = plan_invocation(args)
    if not _is_yacs(runs[0][1]):
        _check_arm_sites(runs[0][1])  # the runs differ in arm, seed and lr only: the same sites
    by_seed = {}
    for spec, cfg in runs:
        init = get_init_checkpoint(cfg)
        if init and len({s.arm for s, _ in runs}) > 1:
            by_seed.setdefault((spec.seed, spec.lr_scale), {})[spec.arm] = init
        check_run(cfg, **kwargs)
    for (seed, _), paths in by_seed.items():
        if len(paths) > 1 and len(set(paths.values())) == 1 and not args.allow_shared_checkpoint:
            raise ValueError(
                f"every arm would start from the same checkpoint {next(iter(paths.values()))} (seed {seed}), which "
                "overwrites the arm at every site it holds: give each arm its own checkpoint with {arm} in "
                "train.init_checkpoint (e.g. \"train.init_checkpoint='output/pretrain/{arm}/seed{seed}'\") or pass "
                "--allow-shared-checkpoint")


def run_worker(args, base: str, spec: RunSpec):
    """Per-process entry point of one planned run (what ``detectron2.engine.launch`` calls in every process).
    A failure leaves a note in the run directory for :func:`execute` and is re-raised."""
    cfg = _run_config(args, base, spec)
    try:
        return run(args, cfg)
    except Preempted:
        raise
    except Exception as e:
        if not args.eval_only and note_failure(get_output_dir(cfg), e, rank=comm.get_rank()):
            logger.exception(f"Run {get_output_dir(cfg)} failed:")
        raise


def _console_logging():
    from detectron2.utils.logger import setup_logger

    _reset_loggers()
    setup_logger(distributed_rank=comm.get_rank())
    setup_logger(name="condinit_det", distributed_rank=comm.get_rank())


def execute(args, only: Optional[RunSpec] = None) -> int:
    """Train (or evaluate) every planned run, each in a launch of its own, then write the comparison when
    there are several runs. Returns the exit status: 1 when a run failed or diverged (named on the last
    lines), else 0. Call :func:`check_invocation` first. ``only``: train that planned run alone (a Slurm
    array element: no plan written, no report)."""
    from condinit_det.utils.distributed import launch

    _console_logging()
    base, runs = plan_invocation(args, only)
    specs = [spec for spec, _ in runs]
    cfg_of = dict(runs)
    main_launcher = int(args.machine_rank) == 0

    def launch_run(spec: RunSpec):
        try:
            launch(run_worker, args.num_gpus, num_machines=args.num_machines, machine_rank=args.machine_rank,
                   dist_url=args.dist_url, args=(args, base, spec), device=get_device(cfg_of[spec]))
        finally:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            _console_logging()

    if args.eval_only:
        launch_run(specs[0])
        return 0
    if main_launcher and only is None:
        _write_plan(args, base, runs)
    outcomes = execute_runs(specs, base, launch=launch_run, finished=lambda spec: _final_recorded(cfg_of[spec]),
                            resume=args.resume, retry_failed=getattr(args, "retry_failed", False),
                            config=args.config_file or None, main=main_launcher)
    from condinit_det.launch.experiment import finish_experiment

    return finish_experiment(base, outcomes, report=len(specs) > 1 and main_launcher and only is None,
                             bootstrap=args.bootstrap)


def _write_plan(args, base: str, runs) -> None:
    write_plan(base, [spec for spec, _ in runs], stage="detection", config=args.config_file or None,
               length={"unit": "iteration", "total": get_max_iter(runs[0][1])})


def submit_to_slurm(args) -> int:
    """``--slurm``: submit every unfinished planned run as an element of one job array and a report job after
    them (:mod:`condinit_det.launch.cluster`); returns 0 once submitted. Call :func:`check_invocation` first."""
    from condinit_det.launch.cluster import submit_experiment

    base, runs = plan_invocation(args)
    cfg_of = dict(runs)
    _write_plan(args, base, runs)
    submit_experiment(args, stage="detection", base=base, specs=[spec for spec, _ in runs],
                      finished=lambda spec: _final_recorded(cfg_of[spec]), name="condinit-train",
                      report=len(runs) > 1, bootstrap=args.bootstrap)
    return 0
