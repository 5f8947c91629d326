"""The embedded "shapes" instance-segmentation dataset (``shapes-v1``) and the drawing helpers the other embedded
datasets share. Image ``i`` of a split is drawn from its own generator seeded by ``(seed, split, i)``: the same bytes
everywhere. An instance's mask holds its *visible* pixels. Details: docs/demos.md#the-embedded-datasets.
"""

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

import cv2
import numpy as np

from .cache import DEFAULT_SEED, Instance, PathLike, check_counts, expected_manifest, generate_atomically, write_coco

__all__ = ["DATASET_VERSION", "SHAPE_CLASSES", "ShapesSpec", "generate_shapes_dataset", "render_image"]

DATASET_VERSION = "shapes-v1"
# Category ids are 1-based (COCO style) in this order.
SHAPE_CLASSES = ("circle", "square", "triangle", "star", "cross")


@dataclass(frozen=True)
class ShapesSpec:
    """Knobs of the generator; the cache directory records them to detect stale data."""

    image_size: int = 128
    min_objects: int = 1
    max_objects: int = 5
    min_size: int = 18  # diameter of the shape's circumscribed circle, pixels
    max_size: int = 56
    # An object is placed only if every instance keeps this fraction of its in-frame area visible (none is hidden).
    min_visible_fraction: float = 0.55
    min_visible_pixels: int = 40
    max_distractors: int = 6
    noise_std: Tuple[float, float] = (2.0, 8.0)
    # Backgrounds keep this fraction of their saturation, so objects stand out by colour.
    background_saturation: float = 0.35
    # Each class has its own hue (jitter std in degrees), random_color_prob of the instances any: a cue, not the answer.
    hue_jitter: float = 14.0
    random_color_prob: float = 0.2


def image_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """The generator of image ``index`` of ``split``: an image does not depend on those drawn before it."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be one of ['train', 'val'], got {split!r}")
    return np.random.default_rng(np.random.SeedSequence([int(seed), ("train", "val").index(split), int(index)]))


def background(rng: np.random.Generator, size: int) -> np.ndarray:
    """Float32 HxWx3 background in [0, 255]: gradient, blotchy noise or stripes."""
    kind = rng.integers(3)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / (size - 1)
    if kind == 0:  # linear gradient between two colours
        c0, c1 = rng.uniform(0, 255, size=(2, 3)).astype(np.float32)
        angle = rng.uniform(0, 2 * np.pi)
        t = np.cos(angle) * xx + np.sin(angle) * yy
        t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
        img = c0 * (1 - t[..., None]) + c1 * t[..., None]
    elif kind == 1:  # low-frequency colour blotches
        cells = int(rng.integers(3, 9))
        coarse = rng.uniform(0, 255, size=(cells, cells, 3)).astype(np.float32)
        img = cv2.resize(coarse, (size, size), interpolation=cv2.INTER_CUBIC)
    else:  # soft stripes over a base colour
        base = rng.uniform(40, 215, size=3).astype(np.float32)
        period = rng.uniform(6, 24)
        angle = rng.uniform(0, np.pi)
        phase = (np.cos(angle) * xx + np.sin(angle) * yy) * size / period
        amp = rng.uniform(10, 40)
        img = base + amp * np.sin(2 * np.pi * phase)[..., None] * rng.uniform(0.3, 1.0, size=3).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.float32)


def desaturate(img: np.ndarray, keep: float) -> np.ndarray:
    gray = img.mean(axis=2, keepdims=True)
    return gray + keep * (img - gray)


def polar(t: np.ndarray) -> np.ndarray:
    return np.stack([np.cos(t), np.sin(t)], 1)


def rotate(points: np.ndarray, angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return points @ np.array([[c, s], [-s, c]], dtype=np.float64)


def fill(size: int, polys: List[np.ndarray]) -> np.ndarray:
    canvas = np.zeros((size, size), np.uint8)
    # Sub-pixel vertex precision (shift=4) keeps small shapes from snapping to the grid.
    # One call per polygon: a single fillPoly call with overlapping polygons uses the even-odd rule.
    for p in polys:
        cv2.fillPoly(canvas, [np.round(p * 16).astype(np.int32)], 1, lineType=cv2.LINE_8, shift=4)
    return canvas.astype(bool)


def shape_mask(category: str, center: np.ndarray, diameter: float, angle: float, size: int) -> np.ndarray:
    """The full (unoccluded) ``size x size`` bool mask of a shape of ``diameter`` (its circumscribed circle's)
    rotated by ``angle``: a class of SHAPE_CLASSES, or ``hexagon``, ``diamond``, ``ring`` (shapes-cls only)."""
    r = diameter / 2.0
    if category == "circle":
        return fill(size, [polar(np.linspace(0, 2 * np.pi, 48, endpoint=False)) * r + center])
    if category == "square":
        pts = np.array([[-1, -1], [1, -1], [1, 1], [-1, 1]], np.float64) * (r / np.sqrt(2))
        return fill(size, [rotate(pts, angle) + center])
    if category == "triangle":
        return fill(size, [polar(np.array([0.0, 2 * np.pi / 3, 4 * np.pi / 3]) + angle) * r + center])
    if category == "star":
        t = np.arange(10) * np.pi / 5 + angle
        radii = np.where(np.arange(10) % 2 == 0, r, 0.42 * r)
        return fill(size, [polar(t) * radii[:, None] + center])
    if category == "cross":
        w = 0.36 * r
        bar = np.array([[-r, -w], [r, -w], [r, w], [-r, w]], np.float64)
        bars = [rotate(bar, angle) + center, rotate(bar, angle + np.pi / 2) + center]
        return fill(size, bars)
    if category == "hexagon":
        return fill(size, [polar(np.arange(6) * np.pi / 3 + angle) * r + center])
    if category == "diamond":
        pts = np.array([[r, 0.0], [0.0, 0.55 * r], [-r, 0.0], [0.0, -0.55 * r]])
        return fill(size, [rotate(pts, angle) + center])
    if category == "ring":
        unit = polar(np.linspace(0, 2 * np.pi, 48, endpoint=False))
        return fill(size, [unit * r + center]) & ~fill(size, [unit * 0.55 * r + center])
    raise ValueError(f"unknown shape {category!r}")


def blob_mask(rng: np.random.Generator, size: int) -> np.ndarray:
    """Irregular polygon clutter: not one of the categories, never annotated."""
    n = int(rng.integers(5, 9))
    r = rng.uniform(4, 14)
    t = np.sort(rng.uniform(0, 2 * np.pi, n))
    radii = r * rng.uniform(0.4, 1.0, n)
    center = rng.uniform(0, size, 2)
    return fill(size, [polar(t) * radii[:, None] + center])


def random_color(rng: np.random.Generator, avoid: np.ndarray) -> np.ndarray:
    """A random colour at least a fixed L1 distance away from ``avoid`` (the local background)."""
    for _ in range(20):
        c = rng.uniform(0, 255, 3)
        if np.abs(c - avoid).sum() > 120:
            return c.astype(np.float32)
    return (255.0 - avoid).astype(np.float32)


def class_color(rng: np.random.Generator, label: int, num_classes: int, hue_jitter: float) -> np.ndarray:
    """Class ``label``'s BGR colour: its own hue jittered by ``hue_jitter`` degrees, at random saturation and value."""
    hue = (label * 360.0 / num_classes + rng.normal(0.0, hue_jitter)) % 360.0
    hsv = np.array([[[hue, rng.uniform(0.55, 1.0), rng.uniform(0.55, 1.0)]]], np.float32)
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0] * 255.0


def draw_lines_and_dots(img: np.ndarray, rng: np.random.Generator, count: int, *, max_dot_radius: int) -> None:
    """Draw ``count`` lines (1 or 2 px thick) or dots of random colours and places on ``img``, in place."""
    size = img.shape[0]
    for _ in range(count):
        color = tuple(float(v) for v in rng.uniform(0, 255, 3))
        if rng.random() < 0.5:
            p0, p1 = (tuple(int(v) for v in rng.integers(0, size, 2)) for _ in range(2))
            cv2.line(img, p0, p1, color, thickness=int(rng.integers(1, 3)))
        else:
            center = tuple(int(v) for v in rng.integers(0, size, 2))
            cv2.circle(img, center, int(rng.integers(1, max_dot_radius + 1)), color, thickness=-1)


def add_noise(img: np.ndarray, rng: np.random.Generator, noise_std: Tuple[float, float]) -> np.ndarray:
    """``img`` plus Gaussian noise of a std drawn from ``noise_std``, rounded to uint8."""
    img = img + rng.normal(0.0, rng.uniform(*noise_std), img.shape).astype(np.float32)
    return np.clip(np.round(img), 0, 255).astype(np.uint8)


def paint(img: np.ndarray, mask: np.ndarray, color: np.ndarray, rng: np.random.Generator) -> None:
    """Paint ``mask`` with ``color`` plus a gentle linear shading, in place."""
    size = img.shape[0]
    ys, xs = np.nonzero(mask)
    g = rng.uniform(-40, 40, 2).astype(np.float32)
    shade = g[0] * (xs.astype(np.float32) / size - 0.5) + g[1] * (ys.astype(np.float32) / size - 0.5)
    img[ys, xs] = np.clip(color[None, :] + shade[:, None], 0, 255)


def render_image(
    seed: int, split: str, index: int, spec: ShapesSpec = ShapesSpec()
) -> Tuple[np.ndarray, List[Instance]]:
    """Image ``index`` of ``split``: (HxWx3 uint8 BGR image, its instances in painting order, later ones on top)."""
    rng = image_rng(seed, split, index)
    size = spec.image_size
    img = desaturate(background(rng, size), spec.background_saturation)

    draw_lines_and_dots(img, rng, int(rng.integers(0, spec.max_distractors + 1)), max_dot_radius=3)

    full_masks: List[np.ndarray] = []  # unoccluded, in-frame
    visible: List[np.ndarray] = []
    categories: List[int] = []
    n_target = int(rng.integers(spec.min_objects, spec.max_objects + 1))
    # Rejection sampling: a placement is kept only if it leaves every object (itself included) visible enough.
    for _ in range(n_target):
        for _attempt in range(12):
            cat = int(rng.integers(len(SHAPE_CLASSES)))
            diameter = rng.uniform(spec.min_size, spec.max_size)
            center = rng.uniform(0.15 * diameter, size - 0.15 * diameter, 2)
            angle = rng.uniform(0, 2 * np.pi)
            m = shape_mask(SHAPE_CLASSES[cat], center, diameter, angle, size)
            area = int(m.sum())
            # Reject shapes too small or cut too much by the image border.
            full_area = np.pi * (diameter / 2) ** 2 * AREA_RATIO[SHAPE_CLASSES[cat]]
            if area < spec.min_visible_pixels or area < 0.6 * full_area:
                continue
            new_visible = [v & ~m for v in visible]
            if all(_visible_ok(v, f, spec) for v, f in zip(new_visible, full_masks)):
                visible = new_visible + [m]
                full_masks.append(m)
                categories.append(cat + 1)
                if rng.random() < spec.random_color_prob:
                    color = random_color(rng, img[m].mean(0))
                else:
                    color = class_color(rng, cat, len(SHAPE_CLASSES), spec.hue_jitter)
                paint(img, m, color, rng)
                break

    # Clutter on top of the objects: irregular blobs that may occlude a little.
    for _ in range(int(rng.integers(0, 3))):
        b = blob_mask(rng, size)
        new_visible = [v & ~b for v in visible]
        if all(_visible_ok(v, f, spec) for v, f in zip(new_visible, full_masks)):
            visible = new_visible
            paint(img, b, random_color(rng, img[b].mean(0) if b.any() else np.zeros(3)), rng)

    return add_noise(img, rng, spec.noise_std), [Instance(c, v) for c, v in zip(categories, visible)]


def _visible_ok(vis: np.ndarray, full: np.ndarray, spec: ShapesSpec) -> bool:
    n = int(vis.sum())
    return n >= spec.min_visible_pixels and n >= spec.min_visible_fraction * int(full.sum())


# Area of each shape relative to its circumscribed circle, used to detect border clipping.
AREA_RATIO = {
    "circle": 1.0,
    "square": 2.0 / np.pi,
    "triangle": 3 * np.sqrt(3) / (4 * np.pi),
    "star": 5 * 0.42 * np.sin(np.pi / 5) / np.pi,
    "cross": (8 * 0.36 - 4 * 0.36**2) / np.pi,  # two bars minus their overlap
}


def generate_shapes_dataset(
    root: Optional[PathLike] = None,
    *,
    seed: int = DEFAULT_SEED,
    num_train: int = 512,
    num_val: int = 64,
    spec: ShapesSpec = ShapesSpec(),
) -> Path:
    """Make sure ``shapes-v1`` made with these parameters exists at ``root``; return the root.

    Args:
        root: the dataset's folder; None for its cache folder (:func:`.cache.generate_atomically`).
        seed: draws every image; num_train, num_val: images per split, at least 1 each.
        spec: the generator's knobs, recorded in the manifest.
    """
    check_counts(1, num_train=num_train, num_val=num_val)
    expected = expected_manifest(DATASET_VERSION, seed, {"train": num_train, "val": num_val}, spec, SHAPE_CLASSES)
    scene = functools.partial(render_image, seed, spec=spec)

    def write(tmp: Path) -> dict:
        return {"num_instances": write_coco(tmp, expected, scene, supercategory="shape"), "image_size": spec.image_size}

    return generate_atomically(root, expected, write)
