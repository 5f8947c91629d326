"""The embedded classification dataset ``shapes-cls-v1``: ``<root>/{train,val}/<class>/<index>.png``, 64x64, 8
classes. Image ``i`` shows one large shape of class ``CLASSES[i % len(CLASSES)]`` on the clutter of :mod:`.shapes`,
drawn from its own generator seeded by ``(seed, split, i)``. Details: docs/pretraining.md.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional, Tuple

import numpy as np

from .cache import DEFAULT_SEED, PathLike, check_counts, expected_manifest, generate_atomically, write_image_folder
from .shapes import (
    add_noise,
    background,
    blob_mask,
    class_color,
    desaturate,
    draw_lines_and_dots,
    image_rng,
    paint,
    random_color,
    shape_mask,
)

__all__ = [
    "CLASSES",
    "DATASET_VERSION",
    "ShapesClsSpec",
    "generate_classification_dataset",
    "render_classification_image",
]

DATASET_VERSION = "shapes-cls-v1"
# Sorted, so that the folder order (timm and torchvision sort class folders by name) is the label order.
CLASSES = ("circle", "cross", "diamond", "hexagon", "ring", "square", "star", "triangle")


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
    # The target takes its class's hue this often, else any colour: a cue to start with, the outline decides the rest.
    class_color_prob: float = 0.5
    hue_jitter: float = 12.0


def render_classification_image(
    seed: int, split: str, index: int, spec: ShapesClsSpec = ShapesClsSpec()
) -> Tuple[np.ndarray, int]:
    """Render image ``index`` of ``split``; returns (HxWx3 uint8 BGR image, class index into CLASSES)."""
    rng = image_rng(seed, split, index)
    size = spec.image_size
    label = int(index) % len(CLASSES)
    img = desaturate(background(rng, size), spec.background_saturation)

    draw_lines_and_dots(img, rng, int(rng.integers(0, spec.max_lines + 1)), max_dot_radius=2)

    # The target: centred with jitter, drawn first so that distractors and blobs may overlap it a little.
    diameter = rng.uniform(spec.min_size, spec.max_size)
    center = size / 2.0 + rng.uniform(-spec.center_jitter, spec.center_jitter, 2)
    target = shape_mask(CLASSES[label], center, diameter, rng.uniform(0, 2 * np.pi), size)
    if rng.random() < spec.class_color_prob:
        color = class_color(rng, label, len(CLASSES), spec.hue_jitter)
    else:
        color = random_color(rng, img[target].mean(0))
    paint(img, target, color, rng)
    visible = target.copy()
    full = int(target.sum())

    def occlude(mask: np.ndarray) -> None:
        # A distractor or a blob is painted only where it leaves the target visible enough.
        if mask.any() and int((visible & ~mask).sum()) >= spec.min_visible_fraction * full:
            visible[mask] = False
            paint(img, mask, random_color(rng, img[mask].mean(0)), rng)

    for _ in range(int(rng.integers(0, spec.max_distractors + 1))):
        category = CLASSES[int(rng.integers(len(CLASSES)))]
        center = rng.uniform(0, size, 2)
        diameter = rng.uniform(*spec.distractor_size)
        occlude(shape_mask(category, center, diameter, rng.uniform(0, 2 * np.pi), size))
    for _ in range(int(rng.integers(0, spec.max_blobs + 1))):
        occlude(blob_mask(rng, size))

    return add_noise(img, rng, spec.noise_std), label


def generate_classification_dataset(
    root: Optional[PathLike] = None,
    *,
    seed: int = DEFAULT_SEED,
    num_train: int = 5000,
    num_val: int = 1000,
    spec: ShapesClsSpec = ShapesClsSpec(),
) -> Path:
    """Make sure ``shapes-cls-v1`` made with these parameters (at least one image per class) exists at ``root``
    (None: its cache folder, :func:`.cache.generate_atomically`); return the root."""
    check_counts(len(CLASSES), num_train=num_train, num_val=num_val)
    expected = expected_manifest(DATASET_VERSION, seed, {"train": num_train, "val": num_val}, spec, CLASSES)

    def image(split: str, index: int):
        img, label = render_classification_image(seed, split, index, spec)
        return f"{index:06d}", label, img

    def write(tmp: Path) -> dict:
        write_image_folder(tmp, expected, image)
        return {"image_size": spec.image_size}

    return generate_atomically(root, expected, write)
