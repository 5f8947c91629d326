"""The embedded datasets of real handwritten digits: ``digits-cls-v1`` (classification, each digit as a 64x64 grey
image) and ``digits-det-v2`` (128x128 COCO scenes of 1 to 5 digits, a mask each, category id = digit + 1). Source:
the 1,797 digits of UCI's optdigits that scikit-learn ships, split once per class (:func:`split_digits`); a changed
checksum stops generation. Details: docs/configs.md#embedded-datasets.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import cv2
import numpy as np

from .cache import (
    DEFAULT_SEED,
    Instance,
    PathLike,
    check_counts,
    expected_manifest,
    generate_atomically,
    write_coco,
    write_image_folder,
)
from .shapes import add_noise, background, desaturate, image_rng

__all__ = [
    "CLASSES",
    "CLS_VERSION",
    "DET_VERSION",
    "DigitsClsSpec",
    "DigitsDetSpec",
    "generate_digits_cls_dataset",
    "generate_digits_det_dataset",
    "load_source_digits",
    "render_digit_image",
    "split_digits",
]

CLS_VERSION = "digits-cls-v1"
DET_VERSION = "digits-det-v2"
# One character each, so that sorted class folders (timm, torchvision) are in label order.
CLASSES = tuple(str(d) for d in range(10))
DEFAULT_VAL_FRACTION = 0.2

# load_digits' data: the sha256 of its pixels then labels (uint8), which generation checks, and the digits per class,
# which give the split sizes a manifest records without importing scikit-learn.
_SOURCE_SHA256 = "87ff0c9e40dc7e2c0e34e7257799c2e3f3aec1a016363bb11cad869ec428a826"
_SOURCE_CLASS_COUNTS = (178, 182, 177, 183, 181, 182, 181, 179, 174, 180)

SOURCE = {
    "name": "Optical Recognition of Handwritten Digits",
    "creators": "E. Alpaydin and C. Kaynak",
    "year": 1998,
    "repository": "UCI Machine Learning Repository",
    "url": "https://archive.ics.uci.edu/dataset/80/optical+recognition+of+handwritten+digits",
    "doi": "10.24432/C50P49",
    "citation": "E. Alpaydin and C. Kaynak (1998). Optical Recognition of Handwritten Digits. "
    "UCI Machine Learning Repository. https://doi.org/10.24432/C50P49",
    "license": "CC BY 4.0",
    "license_url": "https://creativecommons.org/licenses/by/4.0/",
    "carrier": "scikit-learn's sklearn.datasets.load_digits (UCI's optdigits test set: 1,797 digits of 13 writers, "
    "8x8 counts 0..16 of 4x4 blocks of 32x32 bitmaps)",
    "changes": "each 8x8 digit upscaled bicubically; digits-cls: grey images; digits-det: digits inked on "
    "generated canvases, masks by thresholding the upscaled digit",
    "sha256": _SOURCE_SHA256,
    "num_digits": sum(_SOURCE_CLASS_COUNTS),
}


@dataclasses.dataclass(frozen=True)
class DigitsClsSpec:
    """Knobs of ``digits-cls``; the manifest records them so that stale data is detected."""

    image_size: int = 64  # a tiny ViT with patch 8 sees an 8x8 token grid
    margin: int = 1  # blank source pixels around the 8x8 digit before upscaling
    val_fraction: float = DEFAULT_VAL_FRACTION


@dataclasses.dataclass(frozen=True)
class DigitsDetSpec:
    """Knobs of ``digits-det``; the manifest records them so that stale data is detected."""

    image_size: int = 128
    min_objects: int = 1
    max_objects: int = 5
    # Height of the digit's 8x8 cell, pixels. Bicubic upscaling spreads the ink a little into the blank margin
    # around the cell, so a box is at most (8 + 2 * margin) / 8 of that tall (its frame).
    min_size: float = 20.0
    max_size: float = 48.0
    aspect_jitter: float = 0.15  # frame width = height * U(1 - j, 1 + j)
    margin: int = 1
    # Ink at or below this fraction of a full source pixel is anti-aliasing, not stroke: 0.5 cuts thin strokes.
    mask_threshold: float = 0.3
    min_mask_pixels: int = 40
    max_box_overlap: float = 0.1  # intersection over the smaller box's area
    min_gap: int = 2  # pixels between the masks of two digits
    place_attempts: int = 20
    plain_prob: float = 0.3  # else one of the shapes backgrounds (gradient, blotches, stripes)
    background_saturation: float = 0.35
    # Light ink on a dark canvas, as in the source digits: the canvas scaled to this brightness, the ink of this HSV
    # value and at most this saturation, at least min_contrast (L1 over BGR) from the canvas under it.
    canvas_brightness: Tuple[float, float] = (0.1, 0.45)
    ink_value: Tuple[float, float] = (0.75, 1.0)
    ink_saturation: float = 0.7
    min_contrast: float = 150.0
    noise_std: Tuple[float, float] = (2.0, 8.0)
    split_seed: int = DEFAULT_SEED  # the split of :func:`split_digits`, the one digits-cls uses by default
    val_fraction: float = DEFAULT_VAL_FRACTION


@functools.lru_cache(maxsize=1)
def load_source_digits() -> Tuple[np.ndarray, np.ndarray]:
    """The 1,797 source digits, read-only: (pixels uint8 [N, 8, 8] in 0..16, labels int64 [N]); RuntimeError when
    scikit-learn's copy is not the one the datasets were made from."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    pixels, labels = np.asarray(bunch.images).astype(np.uint8), np.asarray(bunch.target).astype(np.int64)
    digest = hashlib.sha256(pixels.tobytes() + labels.astype(np.uint8).tobytes()).hexdigest()
    if digest != _SOURCE_SHA256:
        raise RuntimeError(
            f"scikit-learn's load_digits data has sha256 {digest}, not {_SOURCE_SHA256} of the "
            f"data {CLS_VERSION} and {DET_VERSION} are made from; install a scikit-learn whose "
            "digits are UCI's optdigits test set unchanged"
        )
    pixels.setflags(write=False)
    labels.setflags(write=False)
    return pixels, labels


def _val_count(n: int, val_fraction: float) -> int:
    return int(round(val_fraction * n))


def _check_val_fraction(val_fraction: float) -> None:
    smallest = min(_SOURCE_CLASS_COUNTS)
    if not isinstance(val_fraction, float) or not 0 < _val_count(smallest, val_fraction) < smallest:
        raise ValueError(
            f"val_fraction must be a float that leaves every class digits in both splits "
            f"(0 < val_fraction * {smallest} rounds to 1..{smallest - 1}), got {val_fraction!r}"
        )


def _split_sizes(val_fraction: float) -> Dict[str, int]:
    val = sum(_val_count(n, val_fraction) for n in _SOURCE_CLASS_COUNTS)
    return {"train": sum(_SOURCE_CLASS_COUNTS) - val, "val": val}


def split_digits(
    labels: np.ndarray, seed: int = DEFAULT_SEED, val_fraction: float = DEFAULT_VAL_FRACTION
) -> Dict[str, np.ndarray]:
    """Stratified split: per class, ``round(val_fraction * n)`` digits drawn from ``(seed, class)`` go to val,
    the rest to train. Returns sorted index arrays ``{"train": ..., "val": ...}``."""
    _check_val_fraction(val_fraction)
    labels = np.asarray(labels)
    train: List[np.ndarray] = []
    val: List[np.ndarray] = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        order = np.random.default_rng(np.random.SeedSequence([int(seed), int(c)])).permutation(members)
        n_val = _val_count(len(members), val_fraction)
        val.append(order[:n_val])
        train.append(order[n_val:])
    return {"train": np.sort(np.concatenate(train)), "val": np.sort(np.concatenate(val))}


def digit_ink(pixels: np.ndarray, width: int, height: int, margin: int = 1) -> np.ndarray:
    """A digit's ink in [0, 1] as a float32 ``height x width`` array: the 8x8 counts with ``margin`` blank
    pixels around them, upscaled bicubically (the blank border lets the strokes fade out instead of being cut)."""
    padded = np.pad(np.asarray(pixels, np.float32), int(margin))
    up = cv2.resize(padded, (int(width), int(height)), interpolation=cv2.INTER_CUBIC)
    return np.clip(up / 16.0, 0.0, 1.0)


def render_digit_image(pixels: np.ndarray, spec: DigitsClsSpec = DigitsClsSpec()) -> np.ndarray:
    """One ``digits-cls`` image: HxWx3 uint8, white ink on black, the same in all three channels."""
    ink = digit_ink(pixels, spec.image_size, spec.image_size, spec.margin)
    grey = np.round(ink * 255.0).astype(np.uint8)
    return np.repeat(grey[:, :, None], 3, axis=2)


def _canvas(rng: np.random.Generator, spec: DigitsDetSpec) -> np.ndarray:
    size = spec.image_size
    if rng.random() < spec.plain_prob:
        img = np.broadcast_to(rng.uniform(0, 255, 3).astype(np.float32), (size, size, 3)).copy()
    else:
        img = desaturate(background(rng, size), spec.background_saturation)
    return img * np.float32(rng.uniform(*spec.canvas_brightness))


def _ink_color(rng: np.random.Generator, under: np.ndarray, spec: DigitsDetSpec) -> np.ndarray:
    """A light colour (BGR, 0..255) at least ``spec.min_contrast`` away from ``under``, the canvas under the digit."""
    for _ in range(20):
        hsv = np.array(
            [[[rng.uniform(0, 360), rng.uniform(0, spec.ink_saturation), rng.uniform(*spec.ink_value)]]], np.float32
        )
        color = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0] * 255.0
        if np.abs(color - under).sum() >= spec.min_contrast:
            return color
    return np.full(3, 255.0, np.float32)


def _box_overlap(a: Tuple[int, int, int, int], b: Tuple[int, int, int, int]) -> float:
    """Intersection of two boxes over the smaller one's area."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    if w <= 0 or h <= 0:
        return 0.0
    smaller = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
    return w * h / smaller


def _scene(
    rng: np.random.Generator, pixels: np.ndarray, labels: np.ndarray, pool: np.ndarray, spec: DigitsDetSpec
) -> Tuple[np.ndarray, List[Instance]]:
    """A scene and its digits, each with its whole mask (digits never overlap) and ``digit_index`` (source digit)."""
    size = spec.image_size
    img = _canvas(rng, spec)
    taken = np.zeros((size, size), np.uint8)  # masks placed so far, grown by min_gap
    grow = cv2.getStructuringElement(cv2.MORPH_RECT, (2 * spec.min_gap + 1, 2 * spec.min_gap + 1))
    boxes: List[Tuple[int, int, int, int]] = []
    placed: List[Instance] = []
    frame = 8 + 2 * spec.margin
    for _ in range(int(rng.integers(spec.min_objects, spec.max_objects + 1))):
        digit = int(pool[rng.integers(len(pool))])
        height = rng.uniform(spec.min_size, spec.max_size)
        width = height * rng.uniform(1 - spec.aspect_jitter, 1 + spec.aspect_jitter)
        ph, pw = int(round(height * frame / 8)), int(round(width * frame / 8))
        ink = digit_ink(pixels[digit], pw, ph, spec.margin)
        stroke = ink > spec.mask_threshold
        if int(stroke.sum()) < spec.min_mask_pixels:
            continue
        ys, xs = np.nonzero(stroke)
        # Rejection sampling of the position: the whole digit in the frame, apart from the others.
        for _attempt in range(spec.place_attempts):
            y0, x0 = int(rng.integers(0, size - ph + 1)), int(rng.integers(0, size - pw + 1))
            mask = np.zeros((size, size), bool)
            mask[y0 : y0 + ph, x0 : x0 + pw] = stroke
            box = (x0 + int(xs.min()), y0 + int(ys.min()), x0 + int(xs.max()) + 1, y0 + int(ys.max()) + 1)
            if taken[mask].any() or any(_box_overlap(box, b) > spec.max_box_overlap for b in boxes):
                continue
            region = img[y0 : y0 + ph, x0 : x0 + pw]
            color = _ink_color(rng, region[stroke].mean(0), spec)
            alpha = ink[:, :, None]
            img[y0 : y0 + ph, x0 : x0 + pw] = region * (1 - alpha) + color[None, None, :] * alpha
            taken |= cv2.dilate(mask.astype(np.uint8), grow)
            boxes.append(box)
            placed.append(Instance(int(labels[digit]) + 1, mask, {"digit_index": digit}))
            break
    return add_noise(img, rng, spec.noise_std), placed


def generate_digits_cls_dataset(
    root: Optional[PathLike] = None,
    *,
    seed: int = DEFAULT_SEED,
    spec: DigitsClsSpec = DigitsClsSpec(),
) -> Path:
    """Make sure ``digits-cls`` made with ``seed`` (the split's) and ``spec`` exists at ``root`` (None: its cache
    folder); return the root. The manifest records the source and the source indices of each split (``split``)."""
    _check_val_fraction(spec.val_fraction)
    expected = expected_manifest(CLS_VERSION, seed, _split_sizes(spec.val_fraction), spec, CLASSES)

    def write(tmp: Path) -> dict:
        pixels, labels = load_source_digits()
        split = split_digits(labels, seed, spec.val_fraction)

        def image(name: str, index: int):
            i = split[name][index]
            return f"{int(i):04d}", int(labels[i]), render_digit_image(pixels[i], spec)

        write_image_folder(tmp, expected, image)
        return {"image_size": spec.image_size, "source": SOURCE, "split": {k: v.tolist() for k, v in split.items()}}

    return generate_atomically(root, expected, write)


def generate_digits_det_dataset(
    root: Optional[PathLike] = None,
    *,
    seed: int = DEFAULT_SEED,
    num_train: int = 512,
    num_val: int = 64,
    spec: DigitsDetSpec = DigitsDetSpec(),
) -> Path:
    """Make sure ``digits-det`` with these parameters exists at ``root`` (None: its cache folder); return the root.
    ``seed`` draws the scenes; ``spec.split_seed`` and ``spec.val_fraction`` choose the digits each split may use."""
    _check_val_fraction(spec.val_fraction)
    check_counts(1, num_train=num_train, num_val=num_val)
    if not 1 <= spec.min_objects <= spec.max_objects:
        raise ValueError(f"need 1 <= min_objects <= max_objects, got {spec.min_objects}, {spec.max_objects}")
    largest = spec.image_size * 8 / (8 + 2 * spec.margin) / (1 + spec.aspect_jitter)  # the widest frame fits
    if not 8 <= spec.min_size <= spec.max_size <= largest:
        raise ValueError(f"digit sizes {spec.min_size}..{spec.max_size} px do not fit a {spec.image_size} px image")
    expected = expected_manifest(DET_VERSION, seed, {"train": num_train, "val": num_val}, spec, CLASSES)

    def write(tmp: Path) -> dict:
        pixels, labels = load_source_digits()
        split = split_digits(labels, spec.split_seed, spec.val_fraction)

        def scene(name: str, index: int):
            return _scene(image_rng(seed, name, index), pixels, labels, split[name], spec)

        return {
            "num_instances": write_coco(tmp, expected, scene, supercategory="digit"),
            "image_size": spec.image_size,
            "source": SOURCE,
            "split": {k: v.tolist() for k, v in split.items()},
        }

    return generate_atomically(root, expected, write)
