"""The embedded classification dataset: determinism, atomic generation, layout and balance."""

import json
import os
import socket
from collections import Counter
from pathlib import Path

import pytest

from condinit_det.data import embedded_dataset_info, resolve_classification_root
from condinit_det.data.cache import cache_root
from condinit_det.data.classification import (
    CLASSES,
    DATASET_VERSION,
    ShapesClsSpec,
    generate_classification_dataset,
    render_classification_image,
)

# Small images and few of them: the tests check the generator, not the default sizes.
SPEC = ShapesClsSpec(image_size=32, min_size=14.0, max_size=22.0, center_jitter=3.0, distractor_size=(4.0, 7.0))
NUM_TRAIN, NUM_VAL = 24, 16


def _files(root: Path):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*.png"))}


def test_two_generations_are_byte_identical(tmp_path):
    a = generate_classification_dataset(tmp_path / "a", num_train=NUM_TRAIN, num_val=NUM_VAL, spec=SPEC)
    b = generate_classification_dataset(tmp_path / "b", num_train=NUM_TRAIN, num_val=NUM_VAL, spec=SPEC)
    fa, fb = _files(a), _files(b)
    assert len(fa) == NUM_TRAIN + NUM_VAL
    assert fa == fb
    # Another seed gives other images.
    c = generate_classification_dataset(tmp_path / "c", seed=7, num_train=NUM_TRAIN, num_val=NUM_VAL, spec=SPEC)
    assert _files(c) != fa


def test_layout_balance_and_manifest(tmp_path):
    root = generate_classification_dataset(tmp_path / "d", num_train=NUM_TRAIN, num_val=NUM_VAL, spec=SPEC)
    for split, n in (("train", NUM_TRAIN), ("val", NUM_VAL)):
        assert sorted(p.name for p in (root / split).iterdir()) == sorted(CLASSES)
        counts = Counter(p.parent.name for p in (root / split).rglob("*.png"))
        assert set(counts.values()) == {n // len(CLASSES)}, counts
    info = embedded_dataset_info(root, dataset="embedded:shapes-cls")
    assert info["classes"] == CLASSES == tuple(sorted(CLASSES))  # folder order is label order
    assert info["num_images"] == {"train": NUM_TRAIN, "val": NUM_VAL} and info["image_size"] == 32
    assert info["version"] == DATASET_VERSION and "names" not in info and "num_instances" not in info
    img, label = render_classification_image(2026, "train", 3, SPEC)
    assert img.shape == (32, 32, 3) and img.dtype.name == "uint8" and label == 3


def test_generation_is_atomic_and_cleans_abandoned_temp_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDINIT_DATA", str(tmp_path))
    root = cache_root(DATASET_VERSION)
    assert root == tmp_path / DATASET_VERSION
    # A temp dir left by a killed generator on this host (pid that no longer exists), and one of a live process.
    dead = tmp_path / f".{root.name}.tmp-{socket.gethostname()}-999999999-x"
    live = tmp_path / f".{root.name}.tmp-{socket.gethostname()}-{os.getpid()}-y"
    for d in (dead, live):
        (d / "train").mkdir(parents=True)
    # A partial dataset at the cache root (no manifest): replaced.
    (root / "train" / "circle").mkdir(parents=True)
    (root / "train" / "circle" / "junk.png").write_bytes(b"not a png")
    out = generate_classification_dataset(None, num_train=NUM_TRAIN, num_val=NUM_VAL, spec=SPEC)
    assert out == root and (root / "manifest.json").is_file()
    assert not (root / "train" / "circle" / "junk.png").exists()
    assert not dead.exists() and live.exists()
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".") and p != live]
    assert leftovers == []
    # A stale cache (other parameters) is regenerated in place; a complete one is reused as is.
    stamp = (root / "manifest.json").stat().st_mtime_ns
    assert generate_classification_dataset(None, num_train=NUM_TRAIN, num_val=NUM_VAL, spec=SPEC) == root
    assert (root / "manifest.json").stat().st_mtime_ns == stamp
    generate_classification_dataset(None, num_train=NUM_TRAIN + 8, num_val=NUM_VAL, spec=SPEC)
    assert json.loads((root / "manifest.json").read_text())["num_images"]["train"] == NUM_TRAIN + 8


def test_explicit_root_is_never_overwritten(tmp_path):
    root = tmp_path / "mine"
    root.mkdir()
    (root / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a complete"):
        generate_classification_dataset(root, num_train=NUM_TRAIN, num_val=NUM_VAL, spec=SPEC)
    assert (root / "notes.txt").read_text() == "keep me"
    with pytest.raises(ValueError, match=f"num_val must be an integer >= {len(CLASSES)}, got 7"):
        generate_classification_dataset(tmp_path / "few", num_train=NUM_TRAIN, num_val=7, spec=SPEC)


def test_embedded_names(tmp_path, monkeypatch):
    monkeypatch.setenv("CONDINIT_DATA", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_classification_root("/some/imagenet") == "/some/imagenet"
    assert resolve_classification_root("~/imagenet") == str(tmp_path / "home" / "imagenet")
    # Only the classification datasets are ImageFolders.
    for name in ("embedded:nope", "embedded:shapes", "embedded:digits-det"):
        with pytest.raises(ValueError, match="accepted: embedded:shapes-cls, embedded:digits-cls or an ImageFolder"):
            resolve_classification_root(name)
    assert not any(tmp_path.iterdir())  # nothing was generated
