"""Data for classification pretraining from timm's parts: ``create_dataset`` on ``<root>/<split>/<class>/<image>``,
``create_transform``, ``Mixup`` and the training samplers."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch
from torch.utils.data import DistributedSampler, Sampler

from ..data import resolve_classification_root
from ..utils.errors import UsageError

_IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")


@dataclass
class Datasets:
    """The two splits (timm ``ImageDataset``), their folders and the class names in label order."""

    train: torch.utils.data.Dataset
    val: torch.utils.data.Dataset
    root: str
    classes: List[str]


def _class_folders(root: str, split: str) -> Tuple[str, List[str]]:
    """The folder of ``split`` and its class folders holding an image, in label order; UsageError when none does."""
    split_dir = os.path.join(root, split)
    if not os.path.isdir(split_dir):
        found = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        raise UsageError(
            f"data.root={root}: no '{split}' folder (found: {', '.join(found) or 'nothing'}); expected "
            f"<root>/<split>/<class>/<image> with splits data.train_split / data.val_split"
        )
    classes, loose = [], 0  # loose: images lying directly in split_dir
    for entry in sorted(os.scandir(split_dir), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=True):
            for _, _, files in os.walk(entry.path, followlinks=True):
                if any(f.lower().endswith(_IMAGE_EXTENSIONS) for f in files):
                    classes.append(entry.name)
                    break
        elif entry.name.lower().endswith(_IMAGE_EXTENSIONS):
            loose += 1
    if not classes:
        raise UsageError(
            f"{split_dir} holds no images in class folders (image types: {' '.join(_IMAGE_EXTENSIONS)}"
            f"{f'; {loose} image(s) lie directly in it' if loose else ''}); expected {split_dir}/<class>/<image>"
        )
    return split_dir, classes


def check_dataset_folders(data: Dict, *, check_num_classes: bool = True) -> Tuple[str, List[str]]:
    """Check, without reading every file, that both splits hold images in class folders, the evaluation classes are
    training classes and (``check_num_classes``) ``data.num_classes`` of them; returns (root, class names)."""
    if not data.get("root"):
        raise UsageError("data.root is not set; pass data.root=/path/to/imagenet or data.root=embedded:shapes-cls")
    root = resolve_classification_root(data["root"])
    if not os.path.isdir(root):
        raise UsageError(f"data.root={root}: no such directory")
    train_dir, classes = _class_folders(root, data["train_split"])
    val_dir, val_classes = _class_folders(root, data["val_split"])
    extra = sorted(set(val_classes) - set(classes))
    if extra:
        raise UsageError(
            f"{val_dir} has class folder(s) absent from {train_dir}: {', '.join(extra[:5])}"
            f"{' ...' if len(extra) > 5 else ''}"
        )
    if check_num_classes and data.get("num_classes") is not None and int(data["num_classes"]) != len(classes):
        shown = ", ".join(classes[:8]) + (" ..." if len(classes) > 8 else "")
        raise UsageError(
            f"data.num_classes={data['num_classes']} but {train_dir} has {len(classes)} class folders "
            f"({shown}); set data.num_classes={len(classes)} or point data.root at another dataset"
        )
    return root, classes


def count_images(data: Dict) -> int:
    """Images of the training split (files with an image extension under its class folders). Walks the folder: a
    few seconds per 100k images; ``data.num_train_images`` in a config saves it (ImageNet-1k: 1281167)."""
    root, _ = check_dataset_folders(data, check_num_classes=False)
    walk = os.walk(os.path.join(root, data["train_split"]), followlinks=True)
    return sum(f.lower().endswith(_IMAGE_EXTENSIONS) for _, _, files in walk for f in files)


def build_datasets(data: Dict) -> Datasets:
    """Both splits with ``timm.data.create_dataset`` after :func:`check_dataset_folders`."""
    from timm.data import create_dataset

    root, _ = check_dataset_folders(data)
    train = create_dataset("", root=os.path.join(root, data["train_split"]), split="train", search_split=False)
    class_map = dict(train.reader.class_to_idx)
    val = create_dataset(
        "", root=os.path.join(root, data["val_split"]), split="validation", search_split=False, class_map=class_map
    )
    names = [c for c, _ in sorted(class_map.items(), key=lambda kv: kv[1])]
    return Datasets(train=train, val=val, root=root, classes=names)


def data_config(data: Dict, model: Optional[torch.nn.Module] = None) -> Dict:
    """timm's ``resolve_data_config`` for the configured input size (mean, std, crop_pct from the model when unset)."""
    from timm.data import resolve_data_config

    args = {"input_size": (3, int(data["img_size"]), int(data["img_size"])), "interpolation": data["interpolation"]}
    for key in ("crop_pct", "mean", "std"):
        if data.get(key) is not None:
            args[key] = tuple(data[key]) if key != "crop_pct" else float(data[key])
    return resolve_data_config(args, model=model)


def set_transforms(datasets: Datasets, *, data: Dict, augment: Dict, model: Optional[torch.nn.Module] = None) -> None:
    """Attach timm's training transform (augmentation) and evaluation transform (resize + centre crop)."""
    from timm.data import create_transform

    cfg = data_config(data, model)
    # the augment node's keys named as create_transform's arguments (the others are mixup's and the sampler's)
    names = ("scale", "ratio", "hflip", "vflip", "color_jitter", "interpolation", "re_prob", "re_mode", "re_count")
    datasets.train.transform = create_transform(
        cfg["input_size"],
        is_training=True,
        auto_augment=augment["auto_augment"] or None,
        mean=cfg["mean"],
        std=cfg["std"],
        **{name: augment[name] for name in names},
    )
    datasets.val.transform = create_transform(**cfg, is_training=False)  # timm's resolved config, as timm feeds it


def build_mixup(augment: Dict, num_classes: int):
    """timm ``Mixup`` (mixup / cutmix and label smoothing of the targets), or None when both are off."""
    from timm.data import Mixup

    if not (augment["mixup"] > 0 or augment["cutmix"] > 0 or augment["cutmix_minmax"] is not None):
        return None
    return Mixup(
        mixup_alpha=augment["mixup"],
        cutmix_alpha=augment["cutmix"],
        cutmix_minmax=augment["cutmix_minmax"],
        prob=augment["mixup_prob"],
        switch_prob=augment["mixup_switch_prob"],
        mode=augment["mixup_mode"],
        label_smoothing=augment["label_smoothing"],
        num_classes=num_classes,
    )


def build_train_sampler(dataset, augment: Dict, *, world_size: int, rank: int) -> Sampler:
    """``DistributedSampler`` (also for one process), or timm's ``RepeatAugSampler`` for ``augment.repeated_aug``."""
    repeats = augment.get("repeated_aug") or 0
    if repeats:
        from timm.data.distributed_sampler import RepeatAugSampler

        return RepeatAugSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, num_repeats=repeats)
    return DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0, drop_last=False)
