"""The embedded classification dataset "shapes-cls": one shape per image, in an ImageFolder layout.

Layout of a dataset root (timm's ``create_dataset`` / torchvision's ``ImageFolder`` read it)::

    <root>/manifest.json                     generator parameters, classes and counts (written last)
    <root>/train/<class>/<index>.png         e.g. train/star/000042.png
    <root>/val/<class>/<index>.png

Every image is 64x64 (``ShapesClsSpec.image_size``) and shows one large shape of its class, centred
with jitter, rotated, on the cluttered backgrounds of the detection dataset
(:mod:`condinit_det.data.shapes`: gradients, blotches or stripes, lines, dots, noise), with a few
small shapes of any class as distractors and sometimes an occluding blob. Half of the targets
(``class_color_prob``) take their class's hue, jittered, the others an arbitrary colour: colour is
a cue, and the outline decides the rest. Image ``i`` of a split has class
``CLASSES[i % len(CLASSES)]`` (balanced splits) and is drawn from its own generator seeded by
``(seed, split, i)``: the dataset is the same, byte for byte, on every machine.

Generation happens on first use, in a temporary sibling directory renamed into place, so readers
never see half a dataset; a dataset made with other parameters (or an incomplete one) in the cache
is regenerated. The dataset is registered by name: a config's ``data.root`` takes either an
ImageFolder path or an embedded name, ``"embedded:shapes-cls"`` or ``"embedded:digits-cls"`` (real
handwritten digits, :mod:`condinit_det.data.digits`), resolved by :func:`resolve_classification_root`.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple, Union

import cv2
import numpy as np

from .cache import EMBEDDED_PREFIX, cache_root, generate_atomically, read_manifest, write_png
from .shapes import (
    AREA_RATIO,
    background,
    blob_mask,
    desaturate,
    fill,
    image_rng,
    paint,
    random_color,
    rotate,
    shape_mask,
)

__all__ = [
    "CLASSES",
    "DATASET_VERSION",
    "EMBEDDED_PREFIX",
    "ShapesClsSpec",
    "classification_dataset_info",
    "default_root",
    "embedded_classification_names",
    "generate_classification_dataset",
    "register_classification_dataset",
    "render_classification_image",
    "resolve_classification_root",
]


DATASET_VERSION = "shapes-cls-v1"
DEFAULT_SEED = 2026
DEFAULT_NUM_IMAGES = {"train": 5000, "val": 1000}
# Sorted, so that the folder order (timm and torchvision sort class folders by name) is the label order.
CLASSES = ("circle", "cross", "diamond", "hexagon", "ring", "square", "star", "triangle")

PathLike = Union[str, os.PathLike]


@dataclasses.dataclass(frozen=True)
class ShapesClsSpec:
    """Knobs of the generator; the manifest records them so that stale data is detected."""

    image_size: int = 64
    min_size: float = 26.0  # diameter of the target's circumscribed circle, pixels
    max_size: float = 44.0
    center_jitter: float = 7.0  # max offset of the target's centre from the image centre, pixels
    max_distractors: int = 3  # small shapes of any class
    distractor_size: Tuple[float, float] = (8.0, 14.0)
    max_lines: int = 4  # lines and dots under everything
    max_blobs: int = 1  # irregular blobs over the target
    min_visible_fraction: float = 0.8  # of the target, after distractors and blobs
    noise_std: Tuple[float, float] = (2.0, 8.0)
    background_saturation: float = 0.35
    # With this probability the target takes its class's hue (jittered by hue_jitter degrees), else any
    # colour: colour is a cue that gets a model off the ground quickly, the outline decides the rest.
    class_color_prob: float = 0.5
    hue_jitter: float = 12.0



def _extra_mask(category: str, center: np.ndarray, diameter: float, angle: float, size: int) -> np.ndarray:
    """Masks of the classes that the detection renderer does not draw."""
    r = diameter / 2.0
    if category == "hexagon":
        t = np.arange(6) * np.pi / 3 + angle
        return fill(size, [np.stack([np.cos(t), np.sin(t)], 1) * r + center])
    if category == "diamond":
        pts = np.array([[r, 0.0], [0.0, 0.55 * r], [-r, 0.0], [0.0, -0.55 * r]])
        return fill(size, [rotate(pts, angle) + center])
    if category == "ring":
        t = np.linspace(0, 2 * np.pi, 48, endpoint=False)
        unit = np.stack([np.cos(t), np.sin(t)], 1)
        return fill(size, [unit * r + center]) & ~fill(size, [unit * 0.55 * r + center])
    raise ValueError(f"unknown class {category!r}; known: {CLASSES}")


def _mask(category: str, center: np.ndarray, diameter: float, angle: float, size: int) -> np.ndarray:
    if category in AREA_RATIO:
        return shape_mask(category, center, diameter, angle, size)
    return _extra_mask(category, center, diameter, angle, size)


def _target_color(rng: np.random.Generator, label: int, avoid: np.ndarray, spec: ShapesClsSpec) -> np.ndarray:
    """The class hue (evenly spaced around the colour wheel, jittered) or, sometimes, an arbitrary colour."""
    if rng.random() >= spec.class_color_prob:
        return random_color(rng, avoid)
    hue = (label * 360.0 / len(CLASSES) + rng.normal(0.0, spec.hue_jitter)) % 360.0
    hsv = np.array([[[hue, rng.uniform(0.55, 1.0), rng.uniform(0.55, 1.0)]]], np.float32)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0] * 255.0


def render_classification_image(seed: int, split: str, index: int,
                                spec: ShapesClsSpec = ShapesClsSpec()) -> Tuple[np.ndarray, int]:
    """Render image ``index`` of ``split``; returns (HxWx3 uint8 BGR image, class index into CLASSES)."""
    rng = image_rng(seed, split, index)
    size = spec.image_size
    label = int(index) % len(CLASSES)
    img = desaturate(background(rng, size), spec.background_saturation)

    for _ in range(int(rng.integers(0, spec.max_lines + 1))):
        color = tuple(float(v) for v in rng.uniform(0, 255, 3))
        if rng.random() < 0.5:
            p0, p1 = (tuple(int(v) for v in rng.integers(0, size, 2)) for _ in range(2))
            cv2.line(img, p0, p1, color, thickness=int(rng.integers(1, 3)))
        else:
            cv2.circle(img, tuple(int(v) for v in rng.integers(0, size, 2)), int(rng.integers(1, 3)), color, -1)

    # The target: centred with jitter, drawn first so that distractors and blobs may overlap it a little.
    diameter = rng.uniform(spec.min_size, spec.max_size)
    center = size / 2.0 + rng.uniform(-spec.center_jitter, spec.center_jitter, 2)
    target = _mask(CLASSES[label], center, diameter, rng.uniform(0, 2 * np.pi), size)
    paint(img, target, _target_color(rng, label, img[target].mean(0), spec), rng)
    visible = target.copy()
    full = int(target.sum())

    def keeps_target(mask: np.ndarray) -> bool:
        return int((visible & ~mask).sum()) >= spec.min_visible_fraction * full

    for _ in range(int(rng.integers(0, spec.max_distractors + 1))):
        m = _mask(CLASSES[int(rng.integers(len(CLASSES)))], rng.uniform(0, size, 2),
                  rng.uniform(*spec.distractor_size), rng.uniform(0, 2 * np.pi), size)
        if m.any() and keeps_target(m):
            visible &= ~m
            paint(img, m, random_color(rng, img[m].mean(0)), rng)
    for _ in range(int(rng.integers(0, spec.max_blobs + 1))):
        b = blob_mask(rng, size)
        if b.any() and keeps_target(b):
            visible &= ~b
            paint(img, b, random_color(rng, img[b].mean(0)), rng)

    img = img + rng.normal(0.0, rng.uniform(*spec.noise_std), img.shape).astype(np.float32)
    return np.clip(np.round(img), 0, 255).astype(np.uint8), label


# ---------------------------------------------------------------------------------------------
# Generation into a cache directory
# ---------------------------------------------------------------------------------------------
def default_root() -> Path:
    """``$CONDINIT_DATA/shapes-cls-v1`` if the variable is set, else ``~/.cache/condinit_det/shapes-cls-v1``."""
    return cache_root(DATASET_VERSION)


def _expected_manifest(seed: int, num_images: Dict[str, int], spec: ShapesClsSpec) -> dict:
    return {"version": DATASET_VERSION, "seed": int(seed), "num_images": dict(num_images),
            "spec": dataclasses.asdict(spec), "classes": list(CLASSES)}


def _write_split(tmp: Path, split: str, num: int, seed: int, spec: ShapesClsSpec) -> None:
    for name in CLASSES:
        (tmp / split / name).mkdir(parents=True)
    for idx in range(num):
        img, label = render_classification_image(seed, split, idx, spec)
        write_png(tmp / split / CLASSES[label] / f"{idx:06d}.png", img)


def generate_classification_dataset(
    root: Optional[PathLike] = None,
    *,
    seed: int = DEFAULT_SEED,
    num_train: int = DEFAULT_NUM_IMAGES["train"],
    num_val: int = DEFAULT_NUM_IMAGES["val"],
    spec: ShapesClsSpec = ShapesClsSpec(),
    replace_stale: Optional[bool] = None,
) -> Path:
    """Make sure a complete dataset with these parameters exists at ``root``; return the root.

    root: default :func:`default_root` (a cache). Generated atomically (:mod:`condinit_det.data.cache`).
    A dataset made with other parameters, or a folder without a manifest (an incomplete dataset), is
    replaced when ``replace_stale`` (default: True for the default root, else False); otherwise a
    ValueError says what was found.
    """
    if replace_stale is None:
        replace_stale = root is None
    root = Path(root).expanduser() if root is not None else default_root()
    for name, n in (("num_train", num_train), ("num_val", num_val)):
        if isinstance(n, bool) or not isinstance(n, int) or n < len(CLASSES):
            raise ValueError(f"{name} must be an integer >= {len(CLASSES)} (one image per class), got {n!r}")

    def write(tmp: Path) -> dict:
        for split, n in (("train", num_train), ("val", num_val)):
            _write_split(tmp, split, n, seed, spec)
        return {"image_size": spec.image_size}

    expected = _expected_manifest(seed, {"train": num_train, "val": num_val}, spec)
    return generate_atomically(root, expected, write, replace_stale=replace_stale)


def classification_dataset_info(root: Optional[PathLike] = None) -> dict:
    """``root``, ``version``, ``classes``, ``num_classes``, ``image_size``, ``num_images`` of a generated dataset
    (the default one is generated first when ``root`` is None)."""
    root = generate_classification_dataset(None) if root is None else Path(root).expanduser()
    manifest = read_manifest(root)
    if manifest is None:
        raise ValueError(f"{root} is not a generated {DATASET_VERSION} dataset (no manifest.json)")
    return {"root": str(root), "version": manifest["version"], "classes": tuple(manifest["classes"]),
            "num_classes": len(manifest["classes"]), "image_size": manifest["image_size"],
            "num_images": dict(manifest["num_images"])}


# ---------------------------------------------------------------------------------------------
# Names usable as data.root
# ---------------------------------------------------------------------------------------------
_REGISTRY: Dict[str, Callable[[], Path]] = {}


def register_classification_dataset(name: str, builder: Callable[[], PathLike]) -> None:
    """Make ``"embedded:<name>"`` a valid ``data.root``: ``builder()`` returns (after generating) its root."""
    if not name or ":" in name:
        raise ValueError(f"dataset name must be non-empty and without ':'; got {name!r}")
    _REGISTRY[name] = lambda: Path(builder())


def embedded_classification_names() -> Tuple[str, ...]:
    """Every ``"embedded:<name>"`` accepted by :func:`resolve_classification_root`, in the order registered."""
    return tuple(EMBEDDED_PREFIX + n for n in _REGISTRY)


def resolve_classification_root(root: PathLike) -> str:
    """An ImageFolder path as given, or the (generated) folder of an ``"embedded:<name>"`` dataset."""
    text = os.fspath(root)
    if not text.startswith(EMBEDDED_PREFIX):
        return os.path.expanduser(text)
    name = text[len(EMBEDDED_PREFIX):]
    if name not in _REGISTRY:
        raise ValueError(f"data.root={text!r} names no embedded dataset; accepted: "
                         f"{', '.join(embedded_classification_names())} or an ImageFolder path")
    return str(_REGISTRY[name]())


def _digits_cls_root() -> Path:
    # Imported on use: the digits module reads scikit-learn's copy of the data when it generates.
    from .digits import generate_digits_cls_dataset

    return generate_digits_cls_dataset(None)


register_classification_dataset("shapes-cls", lambda: generate_classification_dataset(None))
register_classification_dataset("digits-cls", _digits_cls_root)
