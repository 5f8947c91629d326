"""Tests of the embedded shapes dataset (determinism, COCO validity, caching, registration) and of the registry of
every embedded dataset."""

import json
from pathlib import Path

import numpy as np
import pycocotools.mask as mask_util
import pytest

from condinit_det.data import (
    DATASET_NAMES,
    EMBEDDED_DATASETS,
    SHAPE_CLASSES,
    embedded_dataset_info,
    generate_shapes_dataset,
    register_embedded_datasets,
    render_image,
)
from condinit_det.data import shapes as shapes_module
from condinit_det.data.cache import cache_root

SMALL = dict(num_train=12, num_val=6)


@pytest.fixture(scope="module")
def full_root(tmp_path_factory) -> Path:
    """The dataset at its default size and seed (what the demo configs train on)."""
    return generate_shapes_dataset(tmp_path_factory.mktemp("data") / "shapes-v1")


def _load(root: Path, split: str) -> dict:
    with open(root / "annotations" / f"instances_{split}.json") as f:
        return json.load(f)


def _all_files(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_generation_is_deterministic(tmp_path):
    a = generate_shapes_dataset(tmp_path / "a", **SMALL)
    b = generate_shapes_dataset(tmp_path / "b", **SMALL)
    files_a, files_b = _all_files(a), _all_files(b)
    assert len(files_a) == SMALL["num_train"] + SMALL["num_val"] + 3  # images, two jsons, manifest
    assert files_a == files_b
    # Another seed gives other images.
    c = generate_shapes_dataset(tmp_path / "c", seed=1, **SMALL)
    assert (a / "train" / "000000.png").read_bytes() != (c / "train" / "000000.png").read_bytes()


def test_render_image_is_independent_of_order():
    img_a, inst_a = render_image(5, "val", 3)
    render_image(5, "val", 2)
    img_b, inst_b = render_image(5, "val", 3)
    assert img_a.dtype == np.uint8 and img_a.shape == (128, 128, 3)
    np.testing.assert_array_equal(img_a, img_b)
    assert [i.category_id for i in inst_a] == [i.category_id for i in inst_b]
    with pytest.raises(ValueError, match="split must be one of"):
        render_image(5, "test", 0)


def test_visible_masks_are_disjoint():
    # Later objects hide earlier ones, so visible masks never share a pixel.
    n_occluded_pairs = 0
    for idx in range(20):
        _, instances = render_image(0, "train", idx)
        cover = np.zeros((128, 128), np.int32)
        for inst in instances:
            assert inst.mask.dtype == bool and inst.mask.sum() >= 40
            cover += inst.mask
        assert cover.max() <= 1
        n_occluded_pairs += len(instances) > 1
    assert n_occluded_pairs > 0


@pytest.mark.parametrize("split", ["train", "val"])
def test_annotations_are_valid_coco(full_root, split):
    coco = _load(full_root, split)
    images = {im["id"]: im for im in coco["images"]}
    assert len(images) == len(coco["images"])
    assert [c["name"] for c in coco["categories"]] == list(SHAPE_CLASSES)
    assert [c["id"] for c in coco["categories"]] == list(range(1, len(SHAPE_CLASSES) + 1))
    assert len({a["id"] for a in coco["annotations"]}) == len(coco["annotations"])
    sizes = []
    for ann in coco["annotations"]:
        im = images[ann["image_id"]]
        x, y, w, h = ann["bbox"]
        assert w > 0 and h > 0 and x >= 0 and y >= 0
        assert x + w <= im["width"] and y + h <= im["height"]
        assert ann["iscrowd"] == 0 and ann["area"] > 0
        mask = mask_util.decode(ann["segmentation"])
        assert mask.shape == (im["height"], im["width"])
        assert abs(float(mask.sum()) - ann["area"]) <= 1e-6
        assert abs(float(mask_util.area(ann["segmentation"])) - ann["area"]) <= 1e-6
        ys, xs = np.nonzero(mask)  # the box is tight around the visible mask
        assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == (x, y, x + w, y + h)
        sizes.append(max(w, h))
    # Every class occurs in both splits, at a spread of sizes.
    present = {a["category_id"] for a in coco["annotations"]}
    assert present == set(range(1, len(SHAPE_CLASSES) + 1))
    assert min(sizes) < 24 and max(sizes) > 40
    assert all((full_root / im["file_name"]).is_file() for im in coco["images"])


def test_info_matches_files(full_root):
    info = embedded_dataset_info(full_root)
    assert info["names"] == DATASET_NAMES
    assert info["classes"] == SHAPE_CLASSES and info["num_classes"] == len(SHAPE_CLASSES)
    assert info["image_size"] == 128
    for split in ("train", "val"):
        coco = _load(full_root, split)
        assert info["num_images"][split] == len(coco["images"])
        assert info["num_instances"][split] == len(coco["annotations"])
    assert info["num_images"]["train"] >= 300 and info["num_images"]["val"] >= 50


def test_existing_dataset_is_reused_and_checked(tmp_path):
    root = generate_shapes_dataset(tmp_path / "shapes", **SMALL)
    stamp = (root / "manifest.json").stat().st_mtime_ns
    assert generate_shapes_dataset(root, **SMALL) == root
    assert (root / "manifest.json").stat().st_mtime_ns == stamp
    with pytest.raises(ValueError, match="other parameters"):
        generate_shapes_dataset(root, num_train=SMALL["num_train"] + 1, num_val=SMALL["num_val"])
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "file.txt").write_text("x")
    with pytest.raises(ValueError, match="not a complete"):
        generate_shapes_dataset(junk, **SMALL)
    with pytest.raises(ValueError, match="num_val must be an integer >= 1, got 0"):
        generate_shapes_dataset(tmp_path / "bad", num_train=3, num_val=0)
    with pytest.raises(ValueError, match="num_train must be an integer >= 1, got True"):
        generate_shapes_dataset(tmp_path / "bad", num_train=True, num_val=2)
    assert not (tmp_path / "bad").exists()


def test_stale_default_cache_is_regenerated(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDINIT_DATA", str(tmp_path))
    root = generate_shapes_dataset(**SMALL)
    assert root == tmp_path / "shapes-v1"
    # The default root is a cache: other parameters replace it in place ...
    generate_shapes_dataset(num_train=SMALL["num_train"] + 1, num_val=SMALL["num_val"])
    assert embedded_dataset_info(root)["num_images"]["train"] == SMALL["num_train"] + 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shapes-v1"]
    # ... an explicit root is never overwritten.
    with pytest.raises(ValueError, match="other parameters"):
        generate_shapes_dataset(root, **SMALL)


def test_interrupted_generation_leaves_nothing(tmp_path, monkeypatch):
    real = shapes_module.render_image

    def failing(seed, split, index, spec):
        if split == "val":
            raise KeyboardInterrupt
        return real(seed, split, index, spec)

    monkeypatch.setattr(shapes_module, "render_image", failing)
    with pytest.raises(KeyboardInterrupt):
        generate_shapes_dataset(tmp_path / "shapes", **SMALL)
    assert list(tmp_path.iterdir()) == []


def test_cache_folder_follows_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDINIT_DATA", str(tmp_path))
    assert cache_root("shapes-v1") == tmp_path / "shapes-v1"
    for unset in ("", None):
        if unset is None:
            monkeypatch.delenv("CONDINIT_DATA")
        else:
            monkeypatch.setenv("CONDINIT_DATA", unset)
        assert cache_root("shapes-v1") == Path("~/.cache/condinit_det/shapes-v1").expanduser()


def test_the_registry_names_every_embedded_dataset(full_root):
    """The names, cache folders and detectron2 names users and configs rely on."""
    found = {name: (entry.name, entry.version, entry.detectron2_names) for name, entry in EMBEDDED_DATASETS.items()}
    assert found == {
        "shapes": ("shapes", "shapes-v1", ("condinit_shapes_train", "condinit_shapes_val")),
        "digits-det": ("digits-det", "digits-det-v2", ("condinit_digits_train", "condinit_digits_val")),
        "shapes-cls": ("shapes-cls", "shapes-cls-v1", None),
        "digits-cls": ("digits-cls", "digits-cls-v1", None),
    }
    shapes = EMBEDDED_DATASETS["shapes"]
    assert shapes.detectron2_names == DATASET_NAMES and shapes.classes == SHAPE_CLASSES
    assert json.loads((full_root / "manifest.json").read_text())["version"] == shapes.version
    assert shapes.generate(full_root) == full_root  # the registered generator, reusing the dataset there


def test_a_root_holding_another_dataset_is_refused(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.json").write_text(json.dumps({"version": "digits-det-v2"}))
    for call in (lambda: register_embedded_datasets(other), lambda: embedded_dataset_info(other)):
        with pytest.raises(ValueError, match="holds the digits-det-v2 dataset, not shapes-v1"):
            call()
    with pytest.raises(
        ValueError, match="accepted: embedded:shapes, embedded:digits-det, embedded:shapes-cls, embedded:digits-cls"
    ):
        embedded_dataset_info(other, dataset="digits")


def test_registration_is_idempotent(full_root, tmp_path):
    from detectron2.data import DatasetCatalog, MetadataCatalog
    from detectron2.structures import BoxMode

    assert register_embedded_datasets(full_root) == DATASET_NAMES
    assert register_embedded_datasets(full_root) == DATASET_NAMES
    train = DatasetCatalog.get(DATASET_NAMES[0])
    assert len(train) == len(_load(full_root, "train")["images"])
    ann = train[0]["annotations"][0]
    assert ann["bbox_mode"] == BoxMode.XYWH_ABS and isinstance(ann["segmentation"], dict)
    assert 0 <= ann["category_id"] < len(SHAPE_CLASSES)  # contiguous ids after loading
    meta = MetadataCatalog.get(DATASET_NAMES[1])
    assert meta.thing_classes == list(SHAPE_CLASSES)
    assert meta.json_file == str(full_root / "annotations" / "instances_val.json")

    # Another root re-points both names.
    other = generate_shapes_dataset(tmp_path / "other", **SMALL)
    try:
        register_embedded_datasets(other)
        assert len(DatasetCatalog.get(DATASET_NAMES[1])) == SMALL["num_val"]
        assert MetadataCatalog.get(DATASET_NAMES[1]).json_file.startswith(str(other))
    finally:
        register_embedded_datasets(full_root)
