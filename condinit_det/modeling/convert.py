"""timm ImageNet checkpoints -> the one transformer trunk (detectron2 ViT or SwinTransformer, or XCiT) of a built
detectron2 model; a checkpoint that does not fit the trunk is refused with one ValueError naming both. What each
architecture drops, remaps and leaves at its init: docs/checkpoints.md.
"""

from __future__ import annotations

import logging
import math
import os
import re
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import timm
import torch
from detectron2.modeling import SwinTransformer, ViT
from timm.layers import resample_abs_pos_embed
from timm.models.swin_transformer import SwinTransformer as TimmSwinTransformer
from timm.models.vision_transformer import VisionTransformer as TimmVisionTransformer
from timm.models.xcit import Xcit as TimmXcit
from timm.models.xcit import checkpoint_filter_fn as xcit_checkpoint_filter
from torch import nn

from ..utils.checkpoint_io import load_checkpoint
from .xcit import XCiT

__all__ = ["ConvertedCheckpoint", "convert_timm_checkpoint"]

logger = logging.getLogger(__name__)

Checkpoint = Union[Mapping[str, Any], str, "os.PathLike[str]"]
Tensors = Dict[str, torch.Tensor]
# What a per-architecture mapping (timm state dict, trunk) returns: trunk tensors, dropped checkpoint keys, notes.
Conversion = Tuple[Tensors, List[str], List[str]]

# Buffers recomputed from the window size: never converted, never reported missing.
_BUFFERS = ("relative_position_index", "attn_mask")


class ConvertedCheckpoint(dict):
    """A converted state dict (keys of the target model) that says what the conversion did: ``source`` and
    ``target`` described, the trunk's key ``prefix``, the model's keys it does not provide (``missing``; the trunk's
    among them: ``trunk_missing``), the checkpoint keys not used (``dropped``) and ``notes``, one line each."""

    def __init__(
        self,
        data: Tensors,
        *,
        source: str,
        target: str,
        prefix: str,
        missing: Sequence[str],
        dropped: Sequence[str],
        notes: Sequence[str],
    ):
        super().__init__(data)
        self.source = source
        self.target = target
        self.prefix = prefix
        self.missing = list(missing)
        self.trunk_missing = [k for k in self.missing if k.startswith(prefix)]
        self.dropped = list(dropped)
        self.notes = list(notes)

    def summary(self) -> str:
        lines = [f"converted {self.source} -> {self.target}: {len(self)} tensors under {self.prefix!r}"]
        if self.dropped:
            lines.append(f"  dropped from the checkpoint ({len(self.dropped)}): {_abbrev(self.dropped)}")
        if self.trunk_missing:
            lines.append(
                f"  trunk keys not in the checkpoint, keep their init ({len(self.trunk_missing)}): "
                f"{_abbrev(self.trunk_missing)}"
            )
        others = len(self.missing) - len(self.trunk_missing)
        if others > 0:
            lines.append(f"  {others} other model keys (neck, heads) keep their init")
        lines += [f"  {note}" for note in self.notes]
        return "\n".join(lines)


def _abbrev(keys: List[str], n: int = 8) -> str:
    return ", ".join(keys[:n]) + (f", ... (+{len(keys) - n})" if len(keys) > n else "")


def _split(sd: Tensors, classifier: Tuple[str, ...]) -> Tuple[Tensors, List[str]]:
    """(the tensors to convert, the keys dropped): the ones starting with a ``classifier`` prefix are dropped."""
    return {k: v for k, v in sd.items() if not k.startswith(classifier)}, [k for k in sd if k.startswith(classifier)]


def _square_side(n: int) -> Optional[int]:
    side = math.isqrt(max(n, 0))
    return side if side * side == n else None


# Parts of timm's ViT that only serve classification.
_VIT_CLASSIFIER = ("cls_token", "dist_token", "norm.", "fc_norm.", "head.", "head_dist.", "attn_pool.", "head_drop.")


def _convert_vit(sd: Tensors, trunk: ViT) -> Conversion:
    """timm ViT / DeiT -> detectron2 ViT: same names, classifier parts dropped, ``pos_embed`` adapted."""
    out, dropped = _split(sd, _VIT_CLASSIFIER)
    notes: List[str] = []
    pos = out.pop("pos_embed", None)
    if trunk.pos_embed is None:
        if pos is not None:
            dropped.append("pos_embed")
            notes.append("pos_embed dropped: the target ViT has use_abs_pos=False")
    elif pos is None:
        notes.append("the checkpoint has no pos_embed; the target's keeps its init")
    else:
        out["pos_embed"] = _vit_pos_embed(pos, sd, trunk, notes)
    if trunk.blocks[0].attn.use_rel_pos:
        notes.append(
            "rel_pos_h / rel_pos_w (ViTDet relative positions) are not in timm checkpoints: they keep their init"
        )
    return out, dropped, notes


def _vit_pos_embed(pos: torch.Tensor, sd: Tensors, trunk: ViT, notes: List[str]) -> torch.Tensor:
    """The checkpoint's patch grid resized bicubically to the trunk's, with a class slot (the checkpoint's, or zeros)
    when the trunk's table has one."""
    tokens = int("cls_token" in sd) + int("dist_token" in sd)
    # Tables without slots for the prefix tokens (timm's no_embed_class, e.g. DeiT-3) are the grid alone.
    n_prefix = tokens if tokens and _square_side(pos.shape[1] - tokens) else 0
    side = _square_side(pos.shape[1] - n_prefix)
    if side is None:
        raise ValueError(
            f"timm ViT pos_embed of shape {tuple(pos.shape)} is not a square grid (+{tokens} prefix slots)"
        )
    cls_slot = bool(trunk.pretrain_use_cls_token)
    new_side = _square_side(trunk.pos_embed.shape[1] - cls_slot)
    grid = pos[:, n_prefix:]
    if side != new_side:
        # No antialiasing: the kernel detectron2's ViT resizes its own table with at run time.
        grid = resample_abs_pos_embed(grid, [new_side, new_side], num_prefix_tokens=0, antialias=False)
        notes.append(f"pos_embed grid interpolated (bicubic) from {side}x{side} to {new_side}x{new_side}")
    if cls_slot:
        grid = torch.cat([pos[:, :1] if n_prefix else torch.zeros_like(pos[:, :1]), grid], dim=1)
        if not n_prefix:
            notes.append("the checkpoint's pos_embed has no class slot; the target's (unused at run time) is zero")
    if n_prefix > 1:
        notes.append(f"pos_embed: {n_prefix - 1} slot(s) of the distillation / register tokens dropped")
    return grid


def _convert_swin(sd: Tensors, trunk: SwinTransformer) -> Conversion:
    """timm or official-layout Swin -> detectron2 SwinTransformer: timm's PatchMerging moves one stage down, its
    final norm becomes ``norm{last}`` when the last stage is an output; head and buffers are dropped."""
    last = len(trunk.layers) - 1
    has_last_norm = hasattr(trunk, f"norm{last}")
    timm_layout = not any(key.startswith("layers.0.downsample.") for key in sd)
    out: Tensors = {}
    dropped: List[str] = []
    notes: List[str] = []
    for key, value in sd.items():
        if key.endswith(_BUFFERS) or key.startswith("head."):
            dropped.append(key)
        elif key.startswith("norm."):
            if has_last_norm:
                out[f"norm{last}." + key[len("norm.") :]] = value
            else:
                dropped.append(key)
        elif timm_layout and key.startswith("layers.") and ".downsample." in key:
            stage, rest = key[len("layers.") :].split(".", 1)
            out[f"layers.{int(stage) - 1}.{rest}"] = value
        else:
            out[key] = value
    if timm_layout and any(".downsample." in key for key in sd):
        notes.append("PatchMerging moved from the start of stage i (timm) to the end of stage i-1 (detectron2)")
    if "norm.weight" in sd:
        notes.append(
            f"timm's final norm -> norm{last} (the last stage's output norm)"
            if has_last_norm
            else f"timm's final norm dropped: stage {last} is not among the target's out_indices"
        )
    notes.append("relative_position_index / attn_mask buffers are recomputed from the window size, not copied")
    return out, dropped, notes


# Parts of timm's XCiT that only serve classification.
_XCIT_CLASSIFIER = ("cls_token", "cls_attn_blocks.", "norm.", "head.", "head_drop.")


def _convert_xcit(sd: Tensors, trunk: XCiT) -> Conversion:
    """timm or official XCiT -> this project's XCiT (timm's filter renames the official names), classifier dropped."""
    out, dropped = _split(xcit_checkpoint_filter(dict(sd), trunk), _XCIT_CLASSIFIER)
    return out, dropped, []


class _Architecture(NamedTuple):
    trunk_class: type
    label: str
    timm_class: type  # the timm model class whose checkpoints convert into this trunk
    convert: Callable[[Tensors, Any], Conversion]
    init_only: Tuple[str, ...]  # regexes of trunk keys ImageNet checkpoints do not hold
    advice: str


_ADVICE = "pretrain the architecture and size the config builds, or use the config of the checkpoint's architecture"
_ARCHITECTURES = (
    _Architecture(
        ViT,
        "detectron2 ViT",
        TimmVisionTransformer,
        _convert_vit,
        (r"blocks\.\d+\.attn\.rel_pos_[hw]$", r"blocks\.\d+\.residual\.", r"pos_embed$"),
        "detectron2's ViT has no LayerScale, q/k norm, register tokens or pre-norm: " + _ADVICE,
    ),
    _Architecture(
        SwinTransformer,
        "detectron2 SwinTransformer",
        TimmSwinTransformer,
        _convert_swin,
        (r"norm\d+\.", r"absolute_pos_embed$"),
        _ADVICE,
    ),
    _Architecture(XCiT, "condinit_det XCiT", TimmXcit, _convert_xcit, (), _ADVICE),
)


def _read(checkpoint: Checkpoint, trust_pickle: bool) -> Tuple[Tensors, Mapping[str, Any]]:
    """The tensors of a checkpoint (or of the file at that path), unwrapped, and its top-level metadata."""
    if isinstance(checkpoint, (str, os.PathLike)):
        checkpoint = load_checkpoint(checkpoint, trust_pickle=trust_pickle)
    sd: Mapping[str, Any] = checkpoint
    for _ in range(3):
        inner = next((sd[key] for key in ("model", "state_dict", "module") if isinstance(sd.get(key), Mapping)), None)
        if inner is None:
            break
        sd = inner
    tensors = {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    if tensors and all(k.startswith("module.") for k in tensors):
        tensors = {k[len("module.") :]: v for k, v in tensors.items()}
    return tensors, checkpoint


def _find_trunk(model: nn.Module) -> Tuple[str, nn.Module, _Architecture]:
    """``(path, module, architecture)`` of the one trunk inside ``model`` (path ``""``: ``model`` itself)."""
    found = [
        (name, module, arch)
        for name, module in model.named_modules()
        for arch in _ARCHITECTURES
        if isinstance(module, arch.trunk_class)
    ]
    if not found:
        raise ValueError(
            f"no transformer trunk in {type(model).__name__}: convert_timm_checkpoint looks for a "
            f"{', '.join(arch.label for arch in _ARCHITECTURES)} module"
        )
    if len(found) > 1:
        where = ", ".join(f"{name or '<root>'} ({arch.label})" for name, _, arch in found)
        raise ValueError(
            f"several transformer trunks in {type(model).__name__} ({where}); convert into one of "
            f"them by passing it as the model"
        )
    return found[0]


def _attention_size(module: nn.Module) -> Tuple[int, int, Tuple[int, ...]]:
    """(width, number of attention blocks, head counts) of a trunk or a timm model, from its fused-qkv attention."""
    attns = [m for m in module.modules() if isinstance(getattr(m, "qkv", None), nn.Linear) and hasattr(m, "num_heads")]
    return attns[0].qkv.in_features, len(attns), tuple(dict.fromkeys(m.num_heads for m in attns))


def _describe(module: nn.Module, label: str) -> str:
    width, blocks, heads = _attention_size(module)
    return f"{label} (embed_dim={width}, {blocks} attention blocks, num_heads={heads[0] if len(heads) == 1 else heads})"


def _mismatch(source: str, target: str, detail: str, arch: _Architecture) -> ValueError:
    return ValueError(
        f"checkpoint/model mismatch: {source} does not fit the model's trunk, a {target}: {detail}; {arch.advice}"
    )


def _check_timm_model(
    name: str, kwargs: Optional[Mapping[str, Any]], sd: Tensors, trunk: nn.Module, arch: _Architecture, target: str
) -> str:
    """Check ``sd`` and the trunk against timm model ``name`` built on the meta device, classifier and position table
    aside; returns the checkpoint's description."""
    with torch.device("meta"):
        ref = timm.create_model(name, pretrained=False, **dict(kwargs or {}))
    source = _describe(ref, f"the timm {name!r} checkpoint")
    if not isinstance(ref, arch.timm_class):
        raise _mismatch(source, target, f"it is a timm {type(ref).__name__}, not a {arch.timm_class.__name__}", arch)
    diff = [
        k
        for k, v in ref.state_dict().items()
        if not k.startswith(("head", "fc_norm", "pos_embed"))
        and not k.endswith(_BUFFERS)
        and (k not in sd or sd[k].shape != v.shape)
    ]
    if diff:
        raise ValueError(
            f"the checkpoint is not a {name!r} state dict: keys missing or of another shape: {_abbrev(diff)}"
        )
    if _attention_size(ref) != _attention_size(trunk):
        raise _mismatch(source, target, "another width, depth or head count", arch)
    return source


def _check_fit(out: Tensors, trunk: nn.Module, arch: _Architecture, source: str, target: str) -> None:
    """One ValueError when the converted tensors are not exactly the trunk's, detection-only parts aside."""
    shapes = {k: v.shape for k, v in trunk.state_dict().items()}
    extra = [k for k in out if k not in shapes]
    wrong = [
        f"{k} {tuple(v.shape)} vs {tuple(shapes[k])}" for k, v in out.items() if k in shapes and v.shape != shapes[k]
    ]
    lacking = [
        k
        for k in shapes
        if k not in out and not k.endswith(_BUFFERS) and not any(re.match(pattern, k) for pattern in arch.init_only)
    ]
    problems = [
        f"{what} ({len(keys)}): {_abbrev(keys, 4)}"
        for what, keys in (
            ("keys the trunk has no place for", extra),
            ("keys of another shape (checkpoint vs trunk)", wrong),
            ("trunk keys it lacks", lacking),
        )
        if keys
    ]
    if problems:
        raise _mismatch(source, target, "; ".join(problems), arch)


def convert_timm_checkpoint(
    checkpoint: Checkpoint,
    model: nn.Module,
    *,
    timm_model_name: Optional[str] = None,
    timm_model_kwargs: Optional[Mapping[str, Any]] = None,
    trust_pickle: bool = False,
) -> ConvertedCheckpoint:
    """Convert a timm ImageNet checkpoint for the one ViT, SwinTransformer or XCiT trunk in a built detectron2 model,
    under the trunk's path; a checkpoint that does not fit raises one ValueError naming both (docs/checkpoints.md).

    Args:
        checkpoint: a timm state dict, a checkpoint wrapping one, or the path of a ``.safetensors`` / ``.pth`` file (a
            pretraining run's ``model_final`` also gives ``timm_model_name`` and ``timm_model_kwargs``).
        model: the built model, before or after the arm, or the trunk itself.
        timm_model_name, timm_model_kwargs: the ``timm.create_model`` call the checkpoint was trained as, if known:
            checkpoint and trunk are checked against it, head count included (a state dict does not record it).
        trust_pickle: also load a ``.pkl`` or a ``.pth`` that needs full unpickling (either can run code in it).

    Returns:
        :class:`ConvertedCheckpoint` with keys of ``model.state_dict()``, for ``model.load_state_dict(converted,
        strict=False)``; its summary is logged at INFO.
    """
    sd, meta = _read(checkpoint, trust_pickle)
    timm_model_name = timm_model_name or meta.get("timm_model")
    timm_model_kwargs = timm_model_kwargs if timm_model_kwargs is not None else meta.get("model_kwargs")
    where, trunk, arch = _find_trunk(model)
    target = f"{_describe(trunk, arch.label)} at {where or '<root>'}"
    if timm_model_name:
        source = _check_timm_model(timm_model_name, timm_model_kwargs, sd, trunk, arch, target)
    else:
        source = "the checkpoint (no timm model name recorded)"
    out, dropped, notes = arch.convert(sd, trunk)
    _check_fit(out, trunk, arch, source, target)
    prefix = f"{where}." if where else ""
    converted = {prefix + k: v for k, v in out.items()}
    missing = sorted(k for k in model.state_dict() if k not in converted and not k.endswith(_BUFFERS))
    result = ConvertedCheckpoint(
        converted, source=source, target=target, prefix=prefix, missing=missing, dropped=sorted(dropped), notes=notes
    )
    logger.info(result.summary())
    return result
