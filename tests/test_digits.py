"""The embedded digits datasets (real UCI digits from scikit-learn): split, layout, COCO validity, determinism,
provenance, and both ways in: detectron2's catalog and the pretraining stage's ``data.root``."""

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import cv2
import numpy as np
import pycocotools.mask as mask_util
import pytest

from condinit_det.data import (
    DIGIT_CLASSES,
    DIGITS_DATASET_NAMES,
    EMBEDDED_DATASETS,
    embedded_dataset_info,
    generate_digits_cls_dataset,
    generate_digits_det_dataset,
    get_embedded_dataset_dicts,
    register_embedded_datasets,
    resolve_classification_root,
)
from condinit_det.data import digits as digits_module
from condinit_det.data.digits import (
    CLS_VERSION,
    DET_VERSION,
    DigitsDetSpec,
    load_source_digits,
    render_digit_image,
    split_digits,
)

ROOT = Path(__file__).resolve().parents[1]
# Few scenes where the test is about the generator, not the default sizes.
SMALL = dict(num_train=10, num_val=6)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """A $CONDINIT_DATA folder holding both datasets at their default parameters."""
    base = tmp_path_factory.mktemp("condinit_data")
    generate_digits_cls_dataset(base / CLS_VERSION)
    generate_digits_det_dataset(base / DET_VERSION)
    return base


@pytest.fixture(scope="module")
def cls_root(data_dir) -> Path:
    return data_dir / CLS_VERSION


@pytest.fixture(scope="module")
def det_root(data_dir) -> Path:
    return data_dir / DET_VERSION


def _manifest(root: Path) -> dict:
    return json.loads((root / "manifest.json").read_text())


def _coco(root: Path, split: str) -> dict:
    return json.loads((root / "annotations" / f"instances_{split}.json").read_text())


def _files(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------------------------------------
# Source and split
# ---------------------------------------------------------------------------------------------
def test_source_is_the_uci_test_set():
    pixels, labels = load_source_digits()
    assert pixels.shape == (1797, 8, 8) and pixels.dtype == np.uint8
    assert pixels.min() == 0 and pixels.max() == 16
    assert labels.shape == (1797,) and set(labels.tolist()) == set(range(10))
    assert np.bincount(labels).min() >= 170  # about 180 per class
    with pytest.raises(ValueError):
        pixels[0, 0, 0] = 1  # shared by every caller: read-only


def test_split_is_stratified_disjoint_and_complete():
    _, labels = load_source_digits()
    split = split_digits(labels)
    train, val = split["train"], split["val"]
    assert len(np.intersect1d(train, val)) == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, val])), np.arange(1797))
    for c in range(10):
        n = int((labels == c).sum())
        n_val = int((labels[val] == c).sum())
        assert n_val == round(0.2 * n) and int((labels[train] == c).sum()) == n - n_val
    # The same split every time; another seed draws other digits of the same counts per class.
    np.testing.assert_array_equal(split_digits(labels)["val"], val)
    other = split_digits(labels, seed=1)["val"]
    assert not np.array_equal(other, val)
    assert Counter(labels[other].tolist()) == Counter(labels[val].tolist())
    for bad in (0.0, 1.0, 0.001):
        with pytest.raises(ValueError, match="val_fraction"):
            split_digits(labels, val_fraction=bad)


def test_changed_source_is_refused(monkeypatch):
    import sklearn.datasets

    real = sklearn.datasets.load_digits

    def altered():
        bunch = real()
        bunch.images[0, 3, 3] = 16 - bunch.images[0, 3, 3]
        return bunch

    load_source_digits.cache_clear()
    monkeypatch.setattr(sklearn.datasets, "load_digits", altered)
    try:
        with pytest.raises(RuntimeError, match="sha256"):
            load_source_digits()
    finally:
        monkeypatch.undo()
        load_source_digits.cache_clear()
    assert load_source_digits()[0].shape == (1797, 8, 8)


# ---------------------------------------------------------------------------------------------
# digits-cls
# ---------------------------------------------------------------------------------------------
def test_cls_layout_counts_and_manifest(cls_root):
    pixels, labels = load_source_digits()
    manifest = _manifest(cls_root)
    split = split_digits(labels)
    assert manifest["version"] == CLS_VERSION and manifest["classes"] == list(DIGIT_CLASSES)
    assert manifest["num_images"] == {"train": len(split["train"]), "val": len(split["val"])}
    assert sum(manifest["num_images"].values()) == 1797
    for name in ("train", "val"):
        assert manifest["split"][name] == split[name].tolist()
        # Class folders "0".."9" in label order; each file is named by its source index and lies in its label's folder.
        assert sorted(p.name for p in (cls_root / name).iterdir()) == list(DIGIT_CLASSES)
        found = {int(p.stem): int(p.parent.name) for p in (cls_root / name).rglob("*.png")}
        assert sorted(found) == manifest["split"][name]
        assert all(labels[i] == c for i, c in found.items())
    assert not set(manifest["split"]["train"]) & set(manifest["split"]["val"])
    # The files hold the renderer's pixels (PNG is lossless): grey RGB, white ink on a black margin.
    i = manifest["split"]["val"][0]
    img = cv2.imread(str(cls_root / "val" / str(labels[i]) / f"{i:04d}.png"), cv2.IMREAD_UNCHANGED)
    assert img.shape == (64, 64, 3) and manifest["image_size"] == 64
    np.testing.assert_array_equal(img, render_digit_image(pixels[i]))
    assert (img[..., 0] == img[..., 1]).all() and (img[..., 1] == img[..., 2]).all()
    assert img.max() > 200 and img[:2].max() < 30 and img[:, :2].max() < 30


def test_cls_generation_is_deterministic(tmp_path, cls_root):
    again = generate_digits_cls_dataset(tmp_path / "again")
    assert _files(again) == _files(cls_root)


def test_pretraining_reads_embedded_digits_cls(cls_root, monkeypatch):
    from condinit_det.pretrain.data import build_datasets

    monkeypatch.setenv("CONDINIT_DATA", str(cls_root.parent))
    assert EMBEDDED_DATASETS["digits-cls"].version == CLS_VERSION
    assert resolve_classification_root("embedded:digits-cls") == str(cls_root)  # the cache, reused
    data = {"root": "embedded:digits-cls", "train_split": "train", "val_split": "val", "num_classes": 10}
    datasets = build_datasets(data)
    manifest = _manifest(cls_root)
    assert datasets.root == str(cls_root) and datasets.classes == list(DIGIT_CLASSES)
    assert (len(datasets.train), len(datasets.val)) == (manifest["num_images"]["train"], manifest["num_images"]["val"])
    # Every sample's label is its source digit's (the file is named by its source index); the pixels are the
    # renderer's.
    pixels, labels = load_source_digits()
    for ds, name in ((datasets.train, "train"), (datasets.val, "val")):
        for k in (0, len(ds) // 2, len(ds) - 1):
            source_index = int(Path(ds.filename(k)).stem)
            assert source_index in manifest["split"][name]
            image, target = ds[k]
            assert image.size == (64, 64) and target == labels[source_index]
            np.testing.assert_array_equal(np.asarray(image), render_digit_image(pixels[source_index]))
    with pytest.raises(ValueError, match="embedded:digits-cls"):
        resolve_classification_root("embedded:digits")


def test_generation_imports_scikit_learn_only_to_generate(cls_root):
    """Resolving a generated dataset (as every pretraining run does) leaves scikit-learn unimported."""
    code = (
        "import sys\n"
        "from condinit_det.data import resolve_classification_root\n"
        "print(resolve_classification_root('embedded:digits-cls'))\n"
        "print('sklearn' in sys.modules)\n"
    )
    env = dict(os.environ, CONDINIT_DATA=str(cls_root.parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    assert out.stdout.split() == [str(cls_root), "False"]


# ---------------------------------------------------------------------------------------------
# digits-det
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("split", ["train", "val"])
def test_det_annotations(det_root, cls_root, split):
    pixels, labels = load_source_digits()
    manifest = _manifest(det_root)
    spec = DigitsDetSpec()
    coco = _coco(det_root, split)
    # Each split's scenes use only that split's digits: the digits-cls split, which pretraining trains on.
    assert manifest["split"] == _manifest(cls_root)["split"]
    allowed = set(manifest["split"][split])
    assert [c["name"] for c in coco["categories"]] == list(DIGIT_CLASSES)
    assert [c["id"] for c in coco["categories"]] == list(range(1, 11))
    assert len(coco["images"]) == manifest["num_images"][split] == {"train": 512, "val": 64}[split]
    assert len(coco["annotations"]) == manifest["num_instances"][split]
    images = {im["id"]: im for im in coco["images"]}
    masks_of = {}
    used = set()
    heights = []
    for ann in coco["annotations"]:
        im = images[ann["image_id"]]
        assert (im["height"], im["width"]) == (128, 128)
        assert ann["digit_index"] in allowed
        used.add(ann["digit_index"])
        assert 1 <= ann["category_id"] <= 10 and ann["category_id"] - 1 == labels[ann["digit_index"]]
        x, y, w, h = ann["bbox"]
        assert x >= 0 and y >= 0 and w > 0 and h > 0 and x + w <= 128 and y + h <= 128
        mask = mask_util.decode(ann["segmentation"]).astype(bool)
        assert mask.shape == (128, 128) and ann["area"] == float(mask.sum()) >= spec.min_mask_pixels
        ys, xs = np.nonzero(mask)  # the box is the mask's tight box
        assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == (x, y, x + w, y + h)
        # The ink stays inside the digit's frame: its 8x8 cell (min_size..max_size tall) and the blank margin.
        assert 8 <= h <= round(spec.max_size * (8 + 2 * spec.margin) / 8)
        heights.append(h)
        masks_of.setdefault(ann["image_id"], []).append((mask, (x, y, x + w, y + h)))
    assert len(used) > 0.25 * len(allowed)  # many digits, not a few repeated
    # Random scales across the whole range of cell heights.
    assert min(heights) < spec.min_size + 4 and max(heights) > spec.max_size - 4
    # Every class in both splits; 1 to 5 digits per scene, several on average.
    assert {a["category_id"] for a in coco["annotations"]} == set(range(1, 11))
    counts = [len(masks_of.get(i, [])) for i in images]
    assert max(counts) <= spec.max_objects and np.mean(counts) > 2
    # Digits never touch and their boxes overlap by at most max_box_overlap of the smaller box.
    grow = np.ones((2 * spec.min_gap + 1,) * 2, np.uint8)
    for found in masks_of.values():
        for i, (mask_a, box_a) in enumerate(found):
            grown = cv2.dilate(mask_a.astype(np.uint8), grow).astype(bool)
            for mask_b, box_b in found[i + 1 :]:
                assert not (grown & mask_b).any()
                iw = min(box_a[2], box_b[2]) - max(box_a[0], box_b[0])
                ih = min(box_a[3], box_b[3]) - max(box_a[1], box_b[1])
                smaller = min((b[2] - b[0]) * (b[3] - b[1]) for b in (box_a, box_b))
                assert max(iw, 0) * max(ih, 0) <= spec.max_box_overlap * smaller + 1e-9


def test_det_digits_are_visible(det_root):
    """The ink under a mask stands out from the rest of its box (a detector can see what is annotated)."""
    coco = _coco(det_root, "val")
    images = {im["id"]: cv2.imread(str(det_root / im["file_name"])).astype(np.float64) for im in coco["images"]}
    contrasts = []
    for ann in coco["annotations"]:
        mask = mask_util.decode(ann["segmentation"]).astype(bool)
        x, y, w, h = (int(v) for v in ann["bbox"])
        around = np.zeros_like(mask)
        around[y : y + h, x : x + w] = True
        around &= ~cv2.dilate(mask.astype(np.uint8), np.ones((3, 3), np.uint8)).astype(bool)
        if around.sum() >= 10:
            img = images[ann["image_id"]]
            contrasts.append(np.abs(img[mask].mean(0) - img[around].mean(0)).sum())
    assert len(contrasts) > 0.8 * len(coco["annotations"])
    assert np.percentile(contrasts, 10) > 40


def test_det_generation_is_deterministic(tmp_path):
    a = generate_digits_det_dataset(tmp_path / "a", **SMALL)
    b = generate_digits_det_dataset(tmp_path / "b", **SMALL)
    files_a = _files(a)
    assert len(files_a) == SMALL["num_train"] + SMALL["num_val"] + 3  # images, two jsons, manifest
    assert files_a == _files(b)
    # Another seed gives other scenes; a scene does not depend on the ones drawn before it: with fewer training
    # scenes, the validation scenes and their annotations are the same.
    c = generate_digits_det_dataset(tmp_path / "c", seed=1, **SMALL)
    assert (c / "train" / "000000.png").read_bytes() != (a / "train" / "000000.png").read_bytes()
    d = generate_digits_det_dataset(tmp_path / "d", num_train=2, num_val=SMALL["num_val"])
    assert {k: v for k, v in _files(d).items() if k.startswith("val/")} == {
        k: v for k, v in files_a.items() if k.startswith("val/")
    }
    assert _coco(d, "val")["annotations"] == _coco(a, "val")["annotations"]


def test_manifests_cite_the_source(cls_root, det_root):
    pixels, labels = load_source_digits()
    for root in (cls_root, det_root):
        source = _manifest(root)["source"]
        assert source["name"] == "Optical Recognition of Handwritten Digits"
        assert source["creators"] == "E. Alpaydin and C. Kaynak" and source["year"] == 1998
        assert source["repository"] == "UCI Machine Learning Repository"
        assert source["license"] == "CC BY 4.0" and source["doi"] == "10.24432/C50P49"
        assert source["url"].startswith("https://archive.ics.uci.edu/dataset/80/")
        assert "Alpaydin" in source["citation"] and "1998" in source["citation"]
        assert "load_digits" in source["carrier"] and source["num_digits"] == len(labels)
        assert source["sha256"] == hashlib.sha256(pixels.tobytes() + labels.astype(np.uint8).tobytes()).hexdigest()
    assert embedded_dataset_info(det_root, dataset="digits-det")["source"]["license"] == "CC BY 4.0"


def test_detectron2_registration(det_root, tmp_path):
    from detectron2.data import DatasetCatalog, MetadataCatalog

    assert register_embedded_datasets(det_root, dataset="digits-det") == DIGITS_DATASET_NAMES
    assert register_embedded_datasets(det_root, dataset="embedded:digits-det") == DIGITS_DATASET_NAMES
    manifest = _manifest(det_root)
    for name, split in zip(DIGITS_DATASET_NAMES, ("train", "val")):
        dicts = DatasetCatalog.get(name)
        assert len(dicts) == manifest["num_images"][split]
        anns = [a for d in dicts for a in d["annotations"]]
        assert len(anns) == manifest["num_instances"][split]
        assert {a["category_id"] for a in anns} == set(range(10))  # contiguous: the digit itself
        assert MetadataCatalog.get(name).thing_classes == list(DIGIT_CLASSES)
    val = get_embedded_dataset_dicts(DIGITS_DATASET_NAMES[1], filter_empty=False, root=det_root)
    assert len(val) == manifest["num_images"]["val"]
    info = embedded_dataset_info(det_root, dataset="digits-det")
    assert info["names"] == DIGITS_DATASET_NAMES and info["num_classes"] == 10 and info["image_size"] == 128

    with pytest.raises(ValueError, match="accepted: embedded:shapes, embedded:digits-det"):
        register_embedded_datasets(det_root, dataset="digits")
    with pytest.raises(ValueError, match="one embedded dataset"):
        get_embedded_dataset_dicts(["condinit_shapes_val", DIGITS_DATASET_NAMES[1]], root=det_root)
    shapes_like = tmp_path / "other"
    shapes_like.mkdir()
    (shapes_like / "manifest.json").write_text(json.dumps({"version": "shapes-v1"}))
    with pytest.raises(ValueError, match="not digits-det-v2"):
        register_embedded_datasets(shapes_like, dataset="digits-det")


def test_the_registry_generates_into_the_cache(cls_root, tmp_path, monkeypatch):
    """The registered generators write to ``$CONDINIT_DATA/<version>``, the folders the registry names."""
    for name, version in (("digits-cls", CLS_VERSION), ("digits-det", DET_VERSION)):
        assert EMBEDDED_DATASETS[name].version == version and EMBEDDED_DATASETS[name].classes == DIGIT_CLASSES
    monkeypatch.setenv("CONDINIT_DATA", str(tmp_path))
    root = EMBEDDED_DATASETS["digits-cls"].generate(None)
    assert root == tmp_path / CLS_VERSION and _files(root) == _files(cls_root)


def test_bad_parameters_and_roots(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="num_val must be an integer >= 1"):
        generate_digits_det_dataset(tmp_path / "x", num_train=3, num_val=0)
    with pytest.raises(ValueError, match="do not fit"):
        generate_digits_det_dataset(tmp_path / "x", spec=DigitsDetSpec(max_size=120.0), **SMALL)
    with pytest.raises(ValueError, match="val_fraction"):
        generate_digits_det_dataset(tmp_path / "x", spec=DigitsDetSpec(val_fraction=1.0), **SMALL)
    assert not (tmp_path / "x").exists()
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a complete"):
        generate_digits_cls_dataset(junk)
    assert (junk / "notes.txt").read_text() == "keep me"
    # An interrupted generation leaves nothing behind.
    monkeypatch.setattr(digits_module, "render_digit_image", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        generate_digits_cls_dataset(tmp_path / "cut")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk"]
