"""FastCOCOEvaluator gives exactly detectron2 COCOEvaluator's (pycocotools) numbers."""

import contextlib
import io
import json
import math
import os
import sys

import pytest
from detectron2.config import LazyCall as L
from detectron2.config import instantiate
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.data.datasets import register_coco_instances
from detectron2.evaluation import COCOEvaluator, SemSegEvaluator
from omegaconf import OmegaConf

from condinit_det.evaluation import FastCOCOEvaluator, to_fast_evaluator

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from synthetic_coco import (  # noqa: E402  (the benchmarks' synthetic COCO data)
    make_synthetic_coco,
    make_synthetic_predictions,
    predictions_to_coco_results,
    predictions_to_instances,
)

NUM_CATEGORIES = 6
EMPTY_IMAGE_ID = 3  # gets no predictions


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A registered synthetic COCO dataset and per-image model outputs (with masks)."""
    root = tmp_path_factory.mktemp("coco_eval")
    gt = make_synthetic_coco(
        num_images=40,
        num_categories=NUM_CATEGORIES,
        empty_categories=1,  # the last category has no ground truth
        crowd_fraction=0.05,
        seed=3,
    )
    json_file = root / "gt.json"
    json_file.write_text(json.dumps(gt))
    name = f"condinit_test_eval_{id(root)}"
    register_coco_instances(name, {}, str(json_file), str(root))
    DatasetCatalog.get(name)  # fills thing_classes / thing_dataset_id_to_contiguous_id
    dets = make_synthetic_predictions(gt, images_without_predictions=(EMPTY_IMAGE_ID,), seed=4)
    inputs, outputs = [], []
    for img in gt["images"]:
        inputs.append({"image_id": img["id"], "height": img["height"], "width": img["width"]})
        outputs.append(predictions_to_instances(dets[img["id"]], (img["height"], img["width"])))
    yield {"name": name, "gt": gt, "dets": dets, "inputs": inputs, "outputs": outputs, "root": root}
    DatasetCatalog.remove(name)
    MetadataCatalog.remove(name)


def run(evaluator, inputs, outputs, **evaluate_kwargs):
    """The DatasetEvaluator protocol as detectron2's inference_on_dataset drives it (batch 2)."""
    evaluator.reset()
    for i in range(0, len(inputs), 2):
        evaluator.process(inputs[i : i + 2], outputs[i : i + 2])
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its summary
        return evaluator.evaluate(**evaluate_kwargs)


def assert_same_results(ours, ref):
    assert ours.keys() == ref.keys()
    for task in ref:
        assert ours[task].keys() == ref[task].keys(), task
        for key, expected in ref[task].items():
            got = ours[task][key]
            if math.isnan(expected):
                assert math.isnan(got), (task, key, got)
            else:
                assert abs(got - expected) <= 1e-9, (task, key, got, expected)


@pytest.fixture(scope="module")
def reference(dataset):
    evaluator = COCOEvaluator(dataset["name"], distributed=False, use_fast_impl=False)
    return run(evaluator, dataset["inputs"], dataset["outputs"])


def test_reference_results_are_meaningful(reference):
    # Guards the parity tests against comparing two trivial results.
    assert set(reference) == {"bbox", "segm"}
    for task in ("bbox", "segm"):
        res = reference[task]
        assert {"AP", "AP50", "AP75", "APs", "APm", "APl"} <= res.keys()
        assert len([k for k in res if k.startswith("AP-")]) == NUM_CATEGORIES
        assert 10.0 < res["AP"] < 90.0
        assert res["AP50"] > res["AP75"]
        assert math.isnan(res[f"AP-class_{NUM_CATEGORIES - 1}"])  # category without ground truth
    assert reference["bbox"]["AP"] != reference["segm"]["AP"]


def test_parity_bbox_and_segm(dataset, reference):
    evaluator = FastCOCOEvaluator(dataset["name"], distributed=False)
    ours = run(evaluator, dataset["inputs"], dataset["outputs"])
    assert_same_results(ours, reference)


def test_parity_distributed_flag_single_process(dataset, reference):
    # With one process, distributed=True gathers to rank 0 = this process.
    ours = run(FastCOCOEvaluator(dataset["name"]), dataset["inputs"], dataset["outputs"])
    assert_same_results(ours, reference)


def test_parity_explicit_tasks_and_img_ids(dataset):
    img_ids = [img["id"] for img in dataset["gt"]["images"][::3]]
    ref = run(
        COCOEvaluator(dataset["name"], tasks=("segm",), distributed=False, use_fast_impl=False),
        dataset["inputs"],
        dataset["outputs"],
        img_ids=img_ids,
    )
    ours = run(
        FastCOCOEvaluator(dataset["name"], tasks=("segm",), distributed=False),
        dataset["inputs"],
        dataset["outputs"],
        img_ids=img_ids,
    )
    assert set(ours) == {"segm"}
    assert_same_results(ours, ref)


def test_parity_custom_max_dets_per_image(dataset):
    # detectron2 switches to its COCOevalMaxDets summary when the limit is not 100.
    ref = run(
        COCOEvaluator(dataset["name"], distributed=False, use_fast_impl=False, max_dets_per_image=5),
        dataset["inputs"],
        dataset["outputs"],
    )
    ours = run(
        FastCOCOEvaluator(dataset["name"], distributed=False, max_dets_per_image=5),
        dataset["inputs"],
        dataset["outputs"],
    )
    assert_same_results(ours, ref)


def test_no_predictions_at_all(dataset):
    empty = [predictions_to_instances([], (inp["height"], inp["width"])) for inp in dataset["inputs"]]
    ref = run(
        COCOEvaluator(dataset["name"], tasks=("bbox", "segm"), distributed=False, use_fast_impl=False),
        dataset["inputs"],
        empty,
    )
    ours = run(
        FastCOCOEvaluator(dataset["name"], tasks=("bbox", "segm"), distributed=False),
        dataset["inputs"],
        empty,
    )
    assert all(math.isnan(v) for v in ours["bbox"].values())
    assert_same_results(ours, ref)


def test_output_dir_writes_same_results_json(dataset, tmp_path):
    ref_dir, our_dir = tmp_path / "ref", tmp_path / "ours"
    run(
        COCOEvaluator(dataset["name"], distributed=False, use_fast_impl=False, output_dir=str(ref_dir)),
        dataset["inputs"],
        dataset["outputs"],
    )
    run(
        FastCOCOEvaluator(dataset["name"], distributed=False, output_dir=str(our_dir)),
        dataset["inputs"],
        dataset["outputs"],
    )
    ref_json = json.loads((ref_dir / "coco_instances_results.json").read_text())
    our_json = json.loads((our_dir / "coco_instances_results.json").read_text())
    assert our_json == ref_json
    assert {r["category_id"] for r in our_json} <= {c["id"] for c in dataset["gt"]["categories"]}
    assert (our_dir / "instances_predictions.pth").is_file()
    assert sorted(p.name for p in our_dir.iterdir()) == [
        "coco_instances_results.json",
        "instances_predictions.pth",
    ]


def test_rejects_out_of_range_class(dataset):
    bad = predictions_to_instances(
        [{"box": [1.0, 1.0, 20.0, 20.0], "score": 0.9, "category": NUM_CATEGORIES, "rle": None}],
        (dataset["inputs"][0]["height"], dataset["inputs"][0]["width"]),
        with_masks=False,
    )
    evaluator = FastCOCOEvaluator(dataset["name"], tasks=("bbox",), distributed=False)
    evaluator.reset()
    evaluator.process(dataset["inputs"][:1], [bad])
    with pytest.raises(ValueError, match=r"class=6.*\[0, 5\]"):
        evaluator.evaluate()


@pytest.mark.parametrize("tasks", ["bbox", ("bbox", "mask")])
def test_rejects_bad_tasks(dataset, tasks):
    with pytest.raises(ValueError, match="tasks must be None or a tuple"):
        FastCOCOEvaluator(dataset["name"], tasks=tasks)


def test_lazy_config_instantiate(dataset):
    cfg = L(FastCOCOEvaluator)(dataset_name=dataset["name"], distributed=False)
    evaluator = instantiate(cfg)
    assert type(evaluator) is FastCOCOEvaluator
    assert evaluator._distributed is False


def test_to_fast_evaluator_keeps_arguments_and_interpolations(dataset, tmp_path):
    cfg = OmegaConf.create(
        {
            "test": {"dataset_name": dataset["name"]},
            "evaluator": L(COCOEvaluator)(
                dataset_name="${..test.dataset_name}", output_dir=str(tmp_path), use_fast_impl=True
            ),
        },
        flags={"allow_objects": True},
    )
    cfg.evaluator = to_fast_evaluator(cfg.evaluator)
    assert "use_fast_impl" not in cfg.evaluator
    assert OmegaConf.to_container(cfg.evaluator, resolve=False)["dataset_name"] == "${..test.dataset_name}"
    evaluator = instantiate(cfg.evaluator)
    assert type(evaluator) is FastCOCOEvaluator
    assert evaluator._output_dir == str(tmp_path)
    assert evaluator._metadata.name == dataset["name"]


def test_to_fast_evaluator_rejects_other_targets():
    with pytest.raises(ValueError, match="LazyCall config node of COCOEvaluator"):
        to_fast_evaluator(L(SemSegEvaluator)(dataset_name="x"))
    with pytest.raises(ValueError, match="LazyCall config node of COCOEvaluator"):
        to_fast_evaluator("COCOEvaluator")


def test_coco_results_helper_matches_process(dataset):
    # The benchmark feeds predictions_to_coco_results() directly; it must equal what process() stores.
    evaluator = COCOEvaluator(dataset["name"], distributed=False, use_fast_impl=False)
    evaluator.reset()
    evaluator.process(dataset["inputs"], dataset["outputs"])
    stored = {p["image_id"]: p["instances"] for p in evaluator._predictions}
    assert len(stored) == len(dataset["inputs"])
    assert stored[EMPTY_IMAGE_ID] == []
    for image_id, dets in dataset["dets"].items():
        assert predictions_to_coco_results(dets, image_id) == stored[image_id], image_id


def _distributed_worker(json_file, dets, out_dir):
    # Runs in each of 2 spawned processes: registers the dataset, evaluates its half of the images.
    import torch
    from detectron2.utils import comm

    torch.set_num_threads(1)
    name = "condinit_test_eval_distributed"
    register_coco_instances(name, {}, json_file, os.path.dirname(json_file))
    DatasetCatalog.get(name)
    gt = json.loads(open(json_file).read())
    images = gt["images"][comm.get_rank() :: comm.get_world_size()]
    inputs = [{"image_id": img["id"]} for img in images]
    outputs = [predictions_to_instances(dets[img["id"]], (img["height"], img["width"])) for img in images]
    result = run(FastCOCOEvaluator(name, distributed=True), inputs, outputs)
    with open(os.path.join(out_dir, f"rank{comm.get_rank()}.json"), "w") as f:
        json.dump(result, f)


@pytest.mark.slow
def test_distributed_gathers_to_rank0(dataset, reference, tmp_path):
    from condinit_det.utils.distributed import launch

    launch(  # CPU processes (gloo), also where CUDA is available
        _distributed_worker,
        2,
        device="cpu",
        dist_url="auto",
        args=(str(dataset["root"] / "gt.json"), dataset["dets"], str(tmp_path)),
    )
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    assert rank1 == {}
    # json turns NaN into NaN floats again, so the usual comparison applies.
    assert_same_results(rank0, reference)


def _keypoint_dataset(seed=0):
    """12 images of 1-3 'person' objects with 17 keypoints; two noisy detections per person."""
    import numpy as np

    rng = np.random.default_rng(seed)
    images, annotations, dets = [], [], {}
    for image_id in range(1, 13):
        images.append({"id": image_id, "file_name": f"{image_id}.jpg", "height": 200, "width": 300})
        dets[image_id] = []
        for _ in range(rng.integers(1, 4)):
            x, y = rng.uniform(0, 150), rng.uniform(0, 80)
            w, h = rng.uniform(30, 140), rng.uniform(40, 110)
            pts = np.stack([rng.uniform(x, x + w, 17), rng.uniform(y, y + h, 17), np.full(17, 2.0)], axis=1)
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": 1,
                    "bbox": [x, y, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                    "num_keypoints": 17,
                    "keypoints": pts.reshape(-1).tolist(),
                }
            )
            for noise in (1.0, 8.0):  # a good and a poor detection of each person
                kpts = pts.copy()
                kpts[:, :2] += rng.normal(0, noise, size=(17, 2)) + 0.5  # model coords are +0.5
                box = [x + rng.normal(0, 2), y + rng.normal(0, 2), x + w, y + h]
                dets[image_id].append((box, float(rng.uniform(0.1, 1.0)), kpts))
    gt = {"images": images, "annotations": annotations, "categories": [{"id": 1, "name": "person"}]}
    return gt, dets


def _keypoint_outputs(dets):
    # Fresh tensors per call: detectron2's instances_to_coco_json shifts pred_keypoints in place.
    import numpy as np
    import torch
    from detectron2.structures import Boxes, Instances

    outputs = []
    for image_id in sorted(dets):
        inst = Instances((200, 300))
        inst.pred_boxes = Boxes(torch.tensor([d[0] for d in dets[image_id]], dtype=torch.float32))
        inst.scores = torch.tensor([d[1] for d in dets[image_id]], dtype=torch.float32)
        inst.pred_classes = torch.zeros(len(dets[image_id]), dtype=torch.int64)
        inst.pred_keypoints = torch.tensor(np.stack([d[2] for d in dets[image_id]]), dtype=torch.float32)
        outputs.append({"instances": inst})
    return outputs


def test_parity_keypoints_and_boxes(tmp_path):
    # Keypoints go through detectron2's own pycocotools path; boxes through faster-coco-eval.
    gt, dets = _keypoint_dataset()
    (tmp_path / "kp.json").write_text(json.dumps(gt))
    name = "condinit_test_eval_keypoints"
    register_coco_instances(name, {}, str(tmp_path / "kp.json"), str(tmp_path))
    DatasetCatalog.get(name)
    inputs = [{"image_id": image_id} for image_id in sorted(dets)]
    try:
        ref = run(
            COCOEvaluator(name, distributed=False, use_fast_impl=False),
            inputs,
            _keypoint_outputs(dets),
        )
        ours = run(FastCOCOEvaluator(name, distributed=False), inputs, _keypoint_outputs(dets))
    finally:
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)
    assert set(ref) == {"bbox", "keypoints"}
    assert 5.0 < ref["keypoints"]["AP"] < 95.0
    assert_same_results(ours, ref)
