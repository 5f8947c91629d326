"""The yacs (``.yaml``) path of ``tools/train_net.py``: detectron2's DefaultTrainer with the arm
applied by the backbone builders (``MODEL.CONDINIT``), the AP hook and the best checkpoint."""
import logging
import os

from detectron2.engine import DefaultTrainer, hooks
from detectron2.utils import comm

from condinit_det.evaluation import FastCOCOEvaluator
from condinit_det.records.results import ResultsFile
from condinit_det.tracking.events import tracker_writers
from condinit_det.utils.distributed import sync_buffers

from .arm_report import log_arm_report, save_arm_report
from .checkpoint import RunCheckpointer
from .hooks import APHook, build_best_checkpointer

__all__ = ["CondinitTrainer", "run_yacs"]

logger = logging.getLogger("detectron2")


class CondinitTrainer(DefaultTrainer):
    """
    DefaultTrainer whose model is built by the project's backbone builders (which apply
    ``MODEL.CONDINIT``'s arm), optimizer by :func:`condinit_det.modeling.yacs_config.build_optimizer`,
    evaluator is COCO box (+ mask) AP, and whose evaluation hook records into ``results.json``.
    """

    def __init__(self, cfg, config_file=None, trust_pickle=False):
        self._config_file = config_file
        self._trust_pickle = trust_pickle  # read by build_hooks, which DefaultTrainer.__init__ calls
        super().__init__(cfg)

    @classmethod
    def build_model(cls, cfg):
        import condinit_det.modeling.backbones  # noqa: F401  (registers the backbone builders)

        model = super().build_model(cfg)
        report = getattr(model.backbone, "condinit_report", None)
        if report is None:
            if cfg.MODEL.CONDINIT.ENABLED and cfg.MODEL.CONDINIT.ARM != "default":
                raise ValueError(
                    f"MODEL.CONDINIT.ARM={cfg.MODEL.CONDINIT.ARM} but MODEL.BACKBONE.NAME="
                    f"{cfg.MODEL.BACKBONE.NAME} does not apply arms; use one of "
                    "build_condinit_vit_backbone, build_condinit_swin_fpn_backbone, "
                    "build_condinit_xcit_backbone."
                )
            return model
        log_arm_report(report)
        return model

    @classmethod
    def test(cls, cfg, model, evaluators=None):
        """DefaultTrainer's evaluation, with every rank holding rank 0's buffers (BatchNorm statistics)."""
        sync_buffers(model.module if hasattr(model, "module") else model)
        return super().test(cfg, model, evaluators)

    def build_writers(self):
        """detectron2's writers and the run's W&B / MLflow runs (main process)."""
        return super().build_writers() + tracker_writers(step_offset=1, max_step=self.max_iter)

    @classmethod
    def build_optimizer(cls, cfg, model):
        from condinit_det.modeling.yacs_config import build_optimizer

        return build_optimizer(cfg, model)

    @classmethod
    def build_evaluator(cls, cfg, dataset_name):
        # pycocotools-identical metrics, computed with faster-coco-eval
        return FastCOCOEvaluator(dataset_name, tasks=("bbox", "segm") if cfg.MODEL.MASK_ON else ("bbox",),
                             output_dir=os.path.join(cfg.OUTPUT_DIR, "inference"))

    def build_hooks(self):
        # Atomic checkpoint writes and clear load errors; DefaultTrainer's hooks take this checkpointer.
        old = self.checkpointer
        period = self.cfg.TEST.EVAL_PERIOD
        results_file = ResultsFile(self.cfg.OUTPUT_DIR)
        metadata = {"arm": str(self.cfg.MODEL.CONDINIT.ARM), "seed": int(self.cfg.SEED),
                    "lr_scale": float(self.cfg.SOLVER.LR_SCALE), "config": self._config_file}
        self.checkpointer = RunCheckpointer(old.model, old.save_dir, trust_pickle=self._trust_pickle,
                                            metadata=metadata, **old.checkpointables)
        ret = super().build_hooks()
        out = []
        for h in ret:
            if type(h) is hooks.EvalHook:
                out.append(APHook(period, h._func, results_file=results_file, metadata=metadata))
                if comm.is_main_process():
                    out.append(build_best_checkpointer(period, self.checkpointer, results_file=results_file))
            else:
                out.append(h)
        return out


def _register_embedded(cfg):
    from condinit_det.data import DATASET_NAMES, register_embedded_datasets

    if set(DATASET_NAMES) & set(cfg.DATASETS.TRAIN + cfg.DATASETS.TEST):
        register_embedded_datasets()


def run_yacs(options, cfg, identity):
    """Train (or with ``options.eval_only`` evaluate) one arm from a yacs config (``options``:
    :class:`condinit_det.stage.RunOptions`); ``identity``: the run's identity."""
    _register_embedded(cfg)
    if options.eval_only:
        model = CondinitTrainer.build_model(cfg)
        RunCheckpointer(model, save_dir=cfg.OUTPUT_DIR, trust_pickle=options.trust_pickle
                        ).resume_or_load(cfg.MODEL.WEIGHTS, resume=options.resume)
        return CondinitTrainer.test(cfg, model)
    trainer = CondinitTrainer(cfg, config_file=options.config_file or None, trust_pickle=options.trust_pickle)
    will_resume = options.resume and trainer.checkpointer.has_checkpoint()
    model = trainer.model.module if hasattr(trainer.model, "module") else trainer.model
    report = getattr(model.backbone, "condinit_report", None)
    trainer.resume_or_load(resume=options.resume)
    if report is not None and comm.is_main_process() and not will_resume:
        save_arm_report(cfg.OUTPUT_DIR, report, identity, init_checkpoint=cfg.MODEL.WEIGHTS or None)
    if trainer.start_iter >= trainer.max_iter:
        logger.info(f"{cfg.OUTPUT_DIR}: training already finished ({trainer.max_iter} iterations).")
        return None
    return trainer.train()
