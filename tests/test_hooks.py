"""The AP hook: storage scalars, results records, best checkpoint, agreement with pycocotools."""

import copy
import os

import numpy as np
import pycocotools.mask as mask_util
import pytest
import torch
from detectron2.config import LazyConfig, instantiate
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.engine import TrainerBase
from detectron2.evaluation import inference_on_dataset
from detectron2.structures import Boxes, Instances
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch import nn

from condinit_det.engine.checkpoint import RunCheckpointer
from condinit_det.engine.hooks import AP_RECORD_METRICS, APHook, ap_record, build_best_checkpointer
from condinit_det.records.results import ResultsFile

CONFIG = os.path.join(os.path.dirname(__file__), "tiny_train_config.py")


class JitteredGroundTruth(nn.Module):
    """
    A stand-in detector: for each validation image it returns its ground-truth objects with
    jittered boxes, a wrong-class duplicate and a spurious box, each with a score, so that AP is
    well inside (0, 100). Predictions depend on the image id and on ``quality`` (0: no
    detections at all). Every output is kept in ``self.outputs``.
    """

    def __init__(self, dataset_name, quality=1.0):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1))  # something for the checkpointer to save
        # dataset dicts carry contiguous category ids (0, 1)
        self.gt = {d["image_id"]: d for d in DatasetCatalog.get(dataset_name)}
        self.quality = quality
        self.outputs = []

    def forward(self, batched_inputs):
        results = []
        for inp in batched_inputs:
            d = self.gt[inp["image_id"]]
            h, w = d["height"], d["width"]
            rng = np.random.RandomState(inp["image_id"])
            boxes, scores, classes = [], [], []
            if self.quality > 0:
                for ann in d["annotations"]:
                    x, y, bw, bh = ann["bbox"]
                    jitter = rng.uniform(-3, 3, size=4) / self.quality
                    box = [x + jitter[0], y + jitter[1], x + bw + jitter[2], y + bh + jitter[3]]
                    boxes += [box, box]
                    scores += [rng.uniform(0.5, 1.0), rng.uniform(0.1, 0.6)]
                    c = ann["category_id"]
                    classes += [c, 1 - c]
                boxes.append([1.0, 20.0, 30.0, 45.0])
                scores.append(0.7)
                classes.append(0)
            inst = Instances((h, w))
            b = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4).clamp(0, min(h, w))
            inst.pred_boxes = Boxes(b)
            inst.scores = torch.tensor(scores, dtype=torch.float32)
            inst.pred_classes = torch.tensor(classes, dtype=torch.int64)
            masks = torch.zeros((len(b), h, w), dtype=torch.bool)
            for i, (x0, y0, x1, y1) in enumerate(b.round().int().tolist()):
                masks[i, y0:y1, x0:x1] = True
            inst.pred_masks = masks
            results.append({"instances": inst})
        self.outputs.extend(zip([i["image_id"] for i in batched_inputs], copy.deepcopy(results)))
        return results


class _IdleTrainer(TrainerBase):
    def run_step(self):
        self.storage.put_scalar("total_loss", 1.0)


@pytest.fixture(scope="module")
def cfg():
    torch.set_num_threads(1)
    return LazyConfig.load(CONFIG)


def _pycocotools_ap(model, cfg, iou_type):
    """Evaluate the stand-in model's recorded predictions with pycocotools directly."""
    name = cfg.dataloader.evaluator.dataset_name
    DatasetCatalog.get(name)  # fills the metadata
    meta = MetadataCatalog.get(name)
    from_contiguous = {v: k for k, v in meta.thing_dataset_id_to_contiguous_id.items()}
    gt = COCO(meta.json_file)
    dets = []
    for image_id, out in model.outputs:
        inst = out["instances"]
        for box, score, cls, mask in zip(
            inst.pred_boxes.tensor.tolist(), inst.scores.tolist(), inst.pred_classes.tolist(), inst.pred_masks.numpy()
        ):
            det = {"image_id": image_id, "category_id": from_contiguous[cls], "score": score}
            if iou_type == "bbox":
                det["bbox"] = [box[0], box[1], box[2] - box[0], box[3] - box[1]]
            else:
                rle = mask_util.encode(np.asfortranarray(mask.astype(np.uint8)))
                rle["counts"] = rle["counts"].decode("ascii")
                det["segmentation"] = rle
            dets.append(det)
    ev = COCOeval(gt, gt.loadRes(dets), iou_type)
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    return ev.stats[:6] * 100


def _train_with_hook(tmp_path, cfg, model, max_iter, eval_period):
    results_file = ResultsFile(tmp_path)
    trainer = _IdleTrainer()
    checkpointer = RunCheckpointer(model, str(tmp_path))

    def evaluate():
        return inference_on_dataset(model, instantiate(cfg.dataloader.test), instantiate(cfg.dataloader.evaluator))

    trainer.register_hooks(
        [
            APHook(
                eval_period,
                evaluate,
                results_file=results_file,
                metadata={"arm": "mimetic", "seed": 3, "config": "tiny.py"},
            ),
            build_best_checkpointer(eval_period, checkpointer, results_file=results_file),
        ]
    )
    trainer.train(0, max_iter)
    return trainer, results_file


def test_hook_ap_matches_pycocotools(tmp_path, cfg):
    model = JitteredGroundTruth(cfg.dataloader.evaluator.dataset_name)
    trainer, results_file = _train_with_hook(tmp_path, cfg, model, max_iter=3, eval_period=2)
    recs = results_file.records("ap")
    # every eval_period iterations and after the last one
    assert [r["iteration"] for r in recs] == [2, 3]
    rec = recs[-1]
    assert (rec["kind"], rec["arm"], rec["seed"], rec["config"]) == ("ap", "mimetic", 3, "tiny.py")
    assert set(rec["bbox"]) == set(AP_RECORD_METRICS) and set(rec["segm"]) == set(AP_RECORD_METRICS)
    assert 5.0 < rec["bbox"]["AP"] < 95.0

    # the last evaluation's predictions, through pycocotools directly
    n_images = len(DatasetCatalog.get(cfg.dataloader.evaluator.dataset_name))
    model.outputs = model.outputs[-n_images:]
    for task in ("bbox", "segm"):
        expected = _pycocotools_ap(model, cfg, task)
        got = [rec[task][m] for m in AP_RECORD_METRICS]
        for g, e in zip(got, expected):
            if e < 0:  # pycocotools' "no objects of that size"
                assert g is None
            else:
                assert g == pytest.approx(e, abs=1e-6)

    # the event storage carries the same numbers (metrics.json / TensorBoard)
    hist = trainer.storage.history("bbox/AP")
    assert hist.latest() == pytest.approx(rec["bbox"]["AP"])
    assert len(hist.values()) == 2
    assert trainer.storage.latest()["segm/AP50"][0] == pytest.approx(rec["segm"]["AP50"])
    assert os.path.isfile(tmp_path / "model_best.pth")
    # saving the best model does not make it the checkpoint that --resume continues from
    assert not os.path.exists(tmp_path / "last_checkpoint")


def test_hook_is_nan_safe_and_best_checkpoint_survives_resume(tmp_path, cfg):
    name = cfg.dataloader.evaluator.dataset_name
    # An earlier run left a good evaluation behind.
    ResultsFile(tmp_path).add(
        ap_record({"bbox": {"AP": 50.0}, "segm": {"AP": 40.0}}, iteration=1, arm="default", seed=0, config=None)
    )
    model = JitteredGroundTruth(name, quality=0.0)  # no detections: every metric NaN
    _, results_file = _train_with_hook(tmp_path, cfg, model, max_iter=2, eval_period=0)
    recs = results_file.records("ap")
    assert [r["iteration"] for r in recs] == [1, 2]
    assert all(v is None for v in recs[1]["bbox"].values())
    assert all(v is None for v in recs[1]["segm"].values())
    assert recs[0]["bbox"]["AP"] == 50.0  # earlier point kept
    assert not os.path.exists(tmp_path / "model_best.pth")  # NaN is never "best"

    best = build_best_checkpointer(5, None, results_file=results_file)
    assert (best.best_metric, best.best_iter) == (50.0, 1)


def test_ap_record_keeps_missing_tasks_as_null():
    rec = ap_record(
        {"bbox": {"AP": 1.0, "AP50": float("nan"), "AP-red": 3.0}}, iteration=7, arm="default", seed=0, config="c.py"
    )
    assert rec["segm"] is None
    assert rec["bbox"] == {"AP": 1.0, "AP50": None, "AP75": None, "APs": None, "APm": None, "APl": None}


def test_hook_saves_every_evaluations_matches(tmp_path, cfg, caplog):
    from condinit_det.evaluation.bootstrap import load_matches, resampled_ap

    name = cfg.dataloader.evaluator.dataset_name
    DatasetCatalog.get(name)  # fills the metadata
    model = JitteredGroundTruth(name)
    evaluator = copy.deepcopy(cfg.dataloader.evaluator)
    evaluator.output_dir = str(tmp_path / "inference")
    predictions = str(tmp_path / "inference" / "coco_instances_results.json")

    def evaluate():
        return inference_on_dataset(model, instantiate(cfg.dataloader.test), instantiate(evaluator))

    def train(ground_truth, out):
        results_file = ResultsFile(out)
        trainer = _IdleTrainer()
        trainer.register_hooks(
            [
                APHook(
                    2,
                    evaluate,
                    results_file=results_file,
                    metadata={"arm": "default", "seed": 0, "config": None},
                    predictions_file=predictions,
                    ground_truth=ground_truth,
                )
            ]
        )
        trainer.train(0, 3)
        return results_file.records("ap")

    recs = train(MetadataCatalog.get(name).json_file, tmp_path)
    assert [(r["iteration"], r["per_image"]) for r in recs] == [
        (2, os.path.join("per_image", "ap_iter0000002.npz")),
        (3, os.path.join("per_image", "ap_iter0000003.npz")),
    ]
    assert "predictions" not in recs[0] and recs[1]["predictions"]  # the final record still names its predictions
    for rec in recs:
        matches = load_matches(str(tmp_path / rec["per_image"]))
        assert set(matches) == {"bbox", "segm"}
        everything = np.arange(matches["bbox"].num_images)[None]
        for task in ("bbox", "segm"):  # the saved matches give the evaluator's AP on the full set
            assert resampled_ap(matches[task], everything)["AP"][0] == pytest.approx(rec[task]["AP"], abs=1e-6)

    # matching that fails is logged; the evaluation is recorded without per-image data and training goes on
    caplog.set_level("WARNING", logger="condinit_det.engine.hooks")
    recs = train(str(tmp_path / "no_such_ground_truth.json"), tmp_path / "other")
    assert [r["iteration"] for r in recs] == [2, 3] and not any("per_image" in r for r in recs)
    assert "per-image matches not saved" in caplog.text


def test_eta_counts_the_evaluations_to_come(tmp_path):
    from detectron2.utils.events import EventStorage

    from condinit_det.utils.logs import ETAPrinter

    class Timed(_IdleTrainer):
        def run_step(self):
            super().run_step()
            self.storage.put_scalar("time", 2.0)

    metadata = {"arm": "default", "seed": 0, "config": None}
    hook = APHook(4, lambda: {"bbox": {"AP": 1.0}}, results_file=ResultsFile(tmp_path), metadata=metadata)
    trainer = Timed()
    trainer.register_hooks([hook])
    trainer.train(0, 10)  # evaluates after iterations 4, 8 and 10
    assert len(hook._durations) == 3
    hook._durations[:] = [5.0, 7.0, 6.0]  # 6 s each
    # after iteration 3 (storage iteration 2): evaluations at 4, 8 and 10 to come; after 8: the last one
    assert [hook.seconds_left(i) for i in (2, 3, 7, 8, 9)] == [18.0, 12.0, 6.0, 6.0, 0.0]
    printer = ETAPrinter(10, hook.seconds_left)
    with EventStorage(0) as storage:
        for it in range(3):
            storage.iter = it
            storage.put_scalar("time", 2.0)
        printer.write()
        # 7 steps of 2 s and three evaluations of 6 s, where detectron2's own printer counts the 14 s of steps only
        assert storage.latest()["eta_seconds"][0] == pytest.approx(7 * 2.0 + 18.0)
