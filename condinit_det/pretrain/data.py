"""Data for classification pretraining, from timm's parts: ``create_dataset`` on ``<root>/<split>/<class>/<image>``
(the evaluation split reads the training split's class map), ``create_transform``, ``Mixup``, and samplers whose
order is a function of (seed, epoch) only, the same for every arm of a seed."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from ..data import resolve_classification_root
from ..utils.errors import UsageError

__all__ = [
    "Datasets",
    "build_datasets",
    "build_mixup",
    "build_train_loader",
    "build_train_sampler",
    "check_dataset_folders",
    "count_images",
    "data_config",
    "epoch_seed",
    "set_sampler_epoch",
    "set_transforms",
]

_IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
# Sampler "epochs" of different seeds never meet: order(seed, epoch) = shuffle(seed * _SEED_STRIDE + epoch).
_SEED_STRIDE = 1_000_003


@dataclass
class Datasets:
    """The two splits (timm ``ImageDataset``), their folders and the class names in label order."""

    train: torch.utils.data.Dataset
    val: torch.utils.data.Dataset
    root: str
    classes: List[str]

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def _split_dir(root: str, split: str) -> str:
    path = os.path.join(root, split)
    if not os.path.isdir(path):
        found = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        raise UsageError(
            f"data.root={root}: no '{split}' folder (found: {', '.join(found) or 'nothing'}); expected "
            f"<root>/<split>/<class>/<image> with splits data.train_split / data.val_split"
        )
    return path


def _class_folders(split_dir: str) -> Tuple[List[str], int]:
    """Class folders that hold at least one image, and images lying directly in ``split_dir``."""
    classes, loose = [], 0
    for entry in sorted(os.scandir(split_dir), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=True):
            for _, _, files in os.walk(entry.path, followlinks=True):
                if any(f.lower().endswith(_IMAGE_EXTENSIONS) for f in files):
                    classes.append(entry.name)
                    break
        elif entry.name.lower().endswith(_IMAGE_EXTENSIONS):
            loose += 1
    return classes, loose


def check_dataset_folders(data: Dict, *, check_num_classes: bool = True) -> Tuple[str, List[str]]:
    """Check (without reading every file) that both splits hold images in class folders, the evaluation classes are
    training classes and (``check_num_classes``) ``data.num_classes`` of them; returns (root, class names in label
    order). Raises UsageError saying what was found and what is expected."""
    if not data.get("root"):
        raise UsageError("data.root is not set; pass data.root=/path/to/imagenet or data.root=embedded:shapes-cls")
    try:
        root = resolve_classification_root(data["root"])
    except ValueError as e:
        raise UsageError(str(e)) from None
    if not os.path.isdir(root):
        raise UsageError(f"data.root={root}: no such directory")
    splits = {}
    for key in ("train_split", "val_split"):
        split_dir = _split_dir(root, data[key])
        classes, loose = _class_folders(split_dir)
        if not classes:
            raise UsageError(
                f"{split_dir} holds no images in class folders (image types: {' '.join(_IMAGE_EXTENSIONS)}"
                f"{f'; {loose} image(s) lie directly in it' if loose else ''}); expected "
                f"{split_dir}/<class>/<image>"
            )
        splits[key] = (split_dir, classes)
    train_dir, classes = splits["train_split"]
    val_dir, val_classes = splits["val_split"]
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
    count = 0
    for _, _, files in os.walk(_split_dir(root, data["train_split"]), followlinks=True):
        count += sum(f.lower().endswith(_IMAGE_EXTENSIONS) for f in files)
    return count


def build_datasets(data: Dict, *, check_num_classes: bool = True) -> Datasets:
    """Both splits with ``timm.data.create_dataset`` after :func:`check_dataset_folders`."""
    from timm.data import create_dataset

    root, _ = check_dataset_folders(data, check_num_classes=check_num_classes)
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
    auto_augment = augment["auto_augment"] or None
    datasets.train.transform = create_transform(
        cfg["input_size"],
        is_training=True,
        scale=tuple(augment["scale"]),
        ratio=tuple(augment["ratio"]),
        hflip=augment["hflip"],
        vflip=augment["vflip"],
        color_jitter=augment["color_jitter"],
        auto_augment=auto_augment,
        interpolation=augment["interpolation"],
        mean=cfg["mean"],
        std=cfg["std"],
        re_prob=augment["re_prob"],
        re_mode=augment["re_mode"],
        re_count=augment["re_count"],
    )
    datasets.val.transform = create_transform(
        cfg["input_size"],
        is_training=False,
        interpolation=cfg["interpolation"],
        mean=cfg["mean"],
        std=cfg["std"],
        crop_pct=cfg["crop_pct"],
        crop_mode=cfg.get("crop_mode"),
    )


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
    """``DistributedSampler`` (also for one process), or timm's ``RepeatAugSampler`` when
    ``augment.repeated_aug > 0``."""
    repeats = augment.get("repeated_aug") or 0
    if repeats:
        from timm.data.distributed_sampler import RepeatAugSampler

        return RepeatAugSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, num_repeats=repeats)
    return DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0, drop_last=False)


def set_sampler_epoch(sampler: Sampler, *, seed: int, epoch: int) -> None:
    """Make the epoch's order a function of (seed, epoch) only (both samplers shuffle with ``manual_seed(epoch)``)."""
    sampler.set_epoch(int(seed) * _SEED_STRIDE + int(epoch))


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """Seed of every RNG at the start of an epoch (augmentation, mixup, drop path) on one process."""
    return int(np.random.SeedSequence([int(seed), int(epoch), int(rank)]).generate_state(1)[0])


def build_train_loader(dataset, sampler: Sampler, *, batch_size: int, workers: int, pin_memory: bool) -> DataLoader:
    """Batches of one process; ``loader.generator`` seeds the workers (re-seed it every epoch)."""
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        pin_memory=pin_memory,
        drop_last=True,
        generator=torch.Generator(),
        persistent_workers=False,
    )
