"""timm ImageNet checkpoints -> this project's detectron2 backbones.

The pretraining stage trains timm models (``timm.create_model(name, pretrained=False, ...)``) and
saves their state dicts; the detection stage builds detectron2 models whose trunks are detectron2's
:class:`~detectron2.modeling.ViT` (ViTDet), :class:`~detectron2.modeling.SwinTransformer` (the
official Swin detection layout) or this project's :class:`~condinit_det.modeling.xcit.XCiT`.
This module maps one onto the other:

- :func:`convert_timm_checkpoint` -- the entry point: finds the trunk anywhere in a built model,
  recognizes the checkpoint's architecture from its keys, refuses an architecture or size the
  trunk does not have (one ValueError saying both), converts with the trunk's prefix and returns a
  :class:`ConvertedCheckpoint` (a dict with keys of ``model.state_dict()``, plus what was dropped,
  kept at init or interpolated).
- :func:`convert_timm_vit`, :func:`convert_timm_swin`, :func:`convert_timm_xcit_checkpoint` --
  the per-architecture converters (prefix given by the caller).

What each converter drops, maps, interpolates and leaves at its init is listed in its docstring.
Every converter takes a state dict or the path of a checkpoint file: ``.safetensors``, ``.pth`` read
with ``weights_only=True`` (:mod:`condinit_det.utils.checkpoint_io`); a ``.pkl`` or a ``.pth`` that needs
full unpickling only with ``trust_pickle=True`` (loading it can run code stored in it).
The result loads with ``model.load_state_dict(converted, strict=False)``; the target keys it does
not provide are ``converted.missing``. Save it with ``torch.save({"model": dict(converted)}, path)``
for detectron2's checkpointer (load without matching heuristics).
"""
from __future__ import annotations

import logging
import math
import os
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from timm.layers import resample_abs_pos_embed
from torch import nn

from ..utils.checkpoint_io import load_checkpoint

__all__ = [
    "ConvertedCheckpoint",
    "UnexpectedCheckpointKey",
    "checkpoint_architecture",
    "convert_timm_checkpoint",
    "convert_timm_swin",
    "convert_timm_vit",
    "convert_timm_xcit_checkpoint",
    "find_trunk",
    "unwrap_state_dict",
]

logger = logging.getLogger(__name__)

StateDict = Mapping[str, torch.Tensor]
Checkpoint = Union[Mapping[str, Any], str, "os.PathLike[str]"]
Target = Union[nn.Module, StateDict]


class UnexpectedCheckpointKey(KeyError, ValueError):
    """A checkpoint key the converter has no place for (a KeyError and a ValueError)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class ConvertedCheckpoint(dict):
    """A converted state dict (keys of the target model) that also says what the conversion did.

    Attributes:
        source: the checkpoint's architecture, e.g. ``"timm ViT (embed_dim=768, depth=12, ...)"``.
        target: the trunk's architecture and where it sits in the model.
        prefix: prepended to the trunk's keys (``"backbone.net."``).
        missing: target keys the checkpoint does not provide (they keep their init): the whole
            model's for :func:`convert_timm_checkpoint` (neck and heads included), the trunk's for
            the per-architecture converters.
        trunk_missing: the trunk's keys among them (e.g. ViTDet's ``rel_pos_h``).
        dropped: checkpoint keys not used (classifier parts, buffers).
        notes: what was mapped, interpolated or left alone, one line each.
    """

    def __init__(self, data=(), *, source: str = "", target: str = "", prefix: str = "",
                 missing: Iterable[str] = (), dropped: Iterable[str] = (), notes: Iterable[str] = ()):
        super().__init__(data)
        self.source = source
        self.target = target
        self.prefix = prefix
        self.missing = list(missing)
        self.trunk_missing = list(missing)
        self.dropped = list(dropped)
        self.notes = list(notes)

    def summary(self) -> str:
        lines = [f"converted {self.source} -> {self.target}: {len(self)} tensors under {self.prefix!r}"]
        if self.dropped:
            lines.append(f"  dropped from the checkpoint ({len(self.dropped)}): {_abbrev(self.dropped)}")
        if self.trunk_missing:
            lines.append(f"  trunk keys not in the checkpoint, keep their init ({len(self.trunk_missing)}): "
                         f"{_abbrev(self.trunk_missing)}")
        others = len(self.missing) - len(self.trunk_missing)
        if others > 0:
            lines.append(f"  {others} other model keys (neck, heads) keep their init")
        lines += [f"  {n}" for n in self.notes]
        return "\n".join(lines)


def _abbrev(keys: Sequence[str], n: int = 8) -> str:
    keys = list(keys)
    return ", ".join(keys[:n]) + (f", ... (+{len(keys) - n})" if len(keys) > n else "")


# ----------------------------------------------------------------------------------------------
# State dicts and shapes
# ----------------------------------------------------------------------------------------------


def _read(checkpoint: Checkpoint, trust_pickle: bool) -> Mapping[str, Any]:
    if isinstance(checkpoint, (str, os.PathLike)):
        return load_checkpoint(checkpoint, trust_pickle=trust_pickle)
    return checkpoint


def unwrap_state_dict(state_dict: Checkpoint, *, trust_pickle: bool = False) -> Dict[str, torch.Tensor]:
    """The tensors of a checkpoint (or of the checkpoint file at that path): unwraps ``{"model": ...}`` /
    ``{"state_dict": ...}`` (timm's training checkpoints, the official XCiT / Swin files) and a
    ``module.`` prefix (DDP)."""
    sd: Mapping[str, Any] = _read(state_dict, trust_pickle)
    for _ in range(3):
        for key in ("model", "state_dict", "module"):
            inner = sd.get(key) if isinstance(sd, Mapping) else None
            if isinstance(inner, Mapping):
                sd = inner
                break
        else:
            break
    tensors = {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    if tensors and all(k.startswith("module.") for k in tensors):
        tensors = {k[len("module."):]: v for k, v in tensors.items()}
    return tensors




def _shapes(target: Target) -> Dict[str, torch.Size]:
    sd = target.state_dict() if isinstance(target, nn.Module) else target
    return {k: (v.shape if isinstance(v, torch.Tensor) else torch.Size(v)) for k, v in sd.items()}


def _indices(keys: Iterable[str], pattern: str) -> List[int]:
    rx = re.compile(pattern)
    return sorted({int(m.group(1)) for k in keys for m in [rx.match(k)] if m})


def _square_side(n: int) -> Optional[int]:
    s = int(round(math.sqrt(n)))
    return s if s * s == n else None


# ----------------------------------------------------------------------------------------------
# Architectures: the size fields an error message names
# ----------------------------------------------------------------------------------------------

_KIND_NAMES = {"vit": "ViT / DeiT", "swin": "Swin", "xcit": "XCiT"}
_TARGET_NAMES = {"vit": "detectron2 ViT", "swin": "detectron2 SwinTransformer", "xcit": "condinit_det XCiT"}
# The first MLP layer, whose output width is the MLP's hidden size.
_FC1 = {"vit": "blocks.0.mlp.fc1.weight", "swin": "layers.0.blocks.0.mlp.fc1.weight", "xcit": "blocks.0.mlp.fc1.weight"}


class _Arch:
    """A trunk's kind and size fields, printed ``name (field=value, ...)`` (unknown fields left out)."""

    def __init__(self, name: str, kind: str, fields: Dict[str, Any]):
        self.name, self.kind, self.fields = name, kind, fields

    def __str__(self) -> str:
        return f"{self.name} ({', '.join(f'{k}={v}' for k, v in self.fields.items() if v is not None)})"


def _size_fields(kind: str, shapes: Mapping[str, torch.Size], num_heads: Optional[int] = None) -> Dict[str, Any]:
    """Width, depth, heads, window, patch size and MLP width of a trunk, read from its parameter shapes.

    timm and detectron2 give these parameters the same names. A ViT's head count is not in its
    shapes: it is ``num_heads`` when the caller knows it.
    """
    fc1 = shapes.get(_FC1[kind])
    mlp_hidden = fc1[0] if fc1 is not None else None
    if kind == "xcit":
        convs = _indices(shapes, r"patch_embed\.proj\.(\d+)\.0\.weight")
        qkv, temperature = shapes.get("blocks.0.attn.qkv.weight"), shapes.get("blocks.0.attn.temperature")
        return {"embed_dim": qkv[1] if qkv is not None else None, "depth": len(_indices(shapes, r"blocks\.(\d+)\.")),
                "num_heads": temperature[0] if temperature is not None else None,
                "patch_size": {4: 16, 3: 8}.get(len(convs)), "mlp_hidden": mlp_hidden}
    w = shapes["patch_embed.proj.weight"]
    fields: Dict[str, Any] = {"embed_dim": w[0]}
    if kind == "vit":
        fields.update(depth=len(_indices(shapes, r"blocks\.(\d+)\.")), num_heads=num_heads)
    else:
        depths, heads, windows = [], [], []
        for stage in _indices(shapes, r"layers\.(\d+)\.blocks\."):
            blocks = _indices(shapes, rf"layers\.{stage}\.blocks\.(\d+)\.")
            table = shapes[f"layers.{stage}.blocks.{blocks[0]}.attn.relative_position_bias_table"]  # ((2w-1)^2, heads)
            side = _square_side(table[0])
            depths.append(len(blocks))
            heads.append(table[1])
            windows.append((side + 1) // 2 if side else -1)
        fields.update(depths=tuple(depths), num_heads=tuple(heads),
                      window_size=windows[0] if len(set(windows)) == 1 else tuple(windows))
    fields.update(patch_size=w[2] if w[2] == w[3] else tuple(w[2:]), in_chans=w[1], mlp_hidden=mlp_hidden)
    return fields


def _swin_layout(keys: Iterable[str]) -> str:
    # Official Swin (and detectron2) put PatchMerging at the end of stage i (layers.0 has one);
    # timm >= 0.9 at the start of stage i + 1 (layers.0 has none).
    return "official" if any(k.startswith("layers.0.downsample.") for k in keys) else "timm"


def _source(sd: StateDict, kind: str, num_heads: Optional[int] = None) -> _Arch:
    """The checkpoint's architecture."""
    shapes = _shapes(sd)
    official = kind == "swin" and _swin_layout(shapes) == "official"
    name = "official-layout Swin" if official else f"timm {_KIND_NAMES[kind]}"
    return _Arch(name, kind, _size_fields(kind, shapes, num_heads))


def _target(target: Target, kind: str) -> Tuple[_Arch, Dict[str, torch.Size]]:
    """The trunk's architecture and its ``{key: shape}``."""
    shapes = _shapes(target)
    num_heads = None
    if kind == "vit":
        if isinstance(target, nn.Module) and len(getattr(target, "blocks", [])):
            num_heads = target.blocks[0].attn.num_heads
        elif "blocks.0.attn.rel_pos_h" in shapes:  # rel_pos_h is (2S - 1, head_dim)
            num_heads = shapes["patch_embed.proj.weight"][0] // shapes["blocks.0.attn.rel_pos_h"][1]
    return _Arch(_TARGET_NAMES[kind], kind, _size_fields(kind, shapes, num_heads)), shapes


def _check_same_architecture(src: _Arch, tgt: _Arch, where: str = "") -> None:
    """One ValueError saying what the checkpoint is and what the model expects, or nothing."""
    at = f" at {where}" if where else ""
    if src.kind != tgt.kind:
        raise ValueError(
            f"checkpoint/model mismatch: the checkpoint is a {src} but the model's trunk{at} is a {tgt}; "
            f"convert a {_KIND_NAMES[tgt.kind]} checkpoint for this config, or use the config of the "
            f"checkpoint's architecture"
        )
    differ = [f for f, v in src.fields.items() if v is not None and tgt.fields.get(f) not in (None, v)]
    if differ:
        raise ValueError(
            f"checkpoint/model mismatch in {', '.join(differ)}: the checkpoint is a {src} but the model's "
            f"trunk{at} is a {tgt}; pretrain the size the config builds, or set the config to the checkpoint's size"
        )


def _check_into_target(out: Mapping[str, torch.Tensor], shapes: Mapping[str, torch.Size], what: str) -> None:
    """Every converted tensor has a key of the target, with the target's shape."""
    extra = sorted(k for k in out if k not in shapes)
    if extra:
        raise ValueError(f"{what}: converted keys absent from the target: {_abbrev(extra)}")
    wrong = [f"{k} {tuple(out[k].shape)} vs {tuple(shapes[k])}" for k in out if tuple(out[k].shape) != tuple(shapes[k])]
    if wrong:
        raise ValueError(f"{what}: shape mismatch (checkpoint vs target): {_abbrev(wrong, 4)}")


# ----------------------------------------------------------------------------------------------
# Recognizing checkpoints, finding the trunk
# ----------------------------------------------------------------------------------------------


def checkpoint_architecture(state_dict: Mapping[str, Any]) -> Optional[str]:
    """``"vit"``, ``"swin"`` or ``"xcit"`` from a timm state dict's keys, or None if none matches."""
    keys = list(unwrap_state_dict(state_dict))
    if any(k.startswith("layers.") and k.endswith("attn.relative_position_bias_table") for k in keys):
        return "swin"
    if any(k.startswith("blocks.") and (k.endswith("attn.temperature") or ".local_mp." in k) for k in keys):
        return "xcit"
    has_blocks = any(k.startswith("blocks.") and k.endswith("attn.qkv.weight") for k in keys)
    if "patch_embed.proj.weight" in keys and has_blocks:
        return "vit"
    return None



def _trunk_kind(module: nn.Module) -> Optional[str]:
    from detectron2.modeling import SwinTransformer, ViT

    from .xcit import XCiT

    if isinstance(module, ViT):
        return "vit"
    if isinstance(module, SwinTransformer):
        return "swin"
    if isinstance(module, XCiT):
        return "xcit"
    return None


def find_trunk(model: nn.Module) -> Tuple[str, nn.Module, str]:
    """``(path, module, kind)`` of the one detectron2 ViT, SwinTransformer or XCiT inside ``model``
    (path ``""`` when ``model`` is the trunk, e.g. ``"backbone.net"`` in a ViTDet model)."""
    found = [(name, m, k) for name, m in model.named_modules() for k in [_trunk_kind(m)] if k]
    if not found:
        raise ValueError(
            f"no transformer trunk in {type(model).__name__}: convert_timm_checkpoint looks for a detectron2 ViT, "
            f"detectron2 SwinTransformer or condinit_det XCiT module"
        )
    if len(found) > 1:
        where = ", ".join(f"{n or '<root>'} ({k})" for n, _, k in found)
        raise ValueError(f"several transformer trunks in {type(model).__name__} ({where}); convert into one of them "
                         f"with convert_timm_vit / convert_timm_swin / convert_timm_xcit_checkpoint")
    return found[0]


def _timm_reference(name: str, sd: StateDict, kind: str, kwargs: Optional[Mapping[str, Any]] = None) -> Optional[int]:
    """Check ``sd`` against timm model ``name`` (built with ``kwargs`` over timm's defaults for that
    name, on the meta device, no weights; classifier and position table not compared) and return
    its head count (which a ViT state dict does not record)."""
    import timm

    with torch.device("meta"):
        ref = timm.create_model(name, pretrained=False, **dict(kwargs or {}))
    # The classifier and the position table (whose grid follows img_size and is interpolated anyway)
    # may legitimately differ from the name's defaults.
    ref_shapes = {k: v.shape for k, v in ref.state_dict().items() if not k.startswith(("head", "fc_norm", "pos_embed"))}
    ref_kind = checkpoint_architecture({k: torch.empty(0) for k in ref_shapes})
    if ref_kind != kind:
        raise ValueError(f"timm model {name!r} is not a {_KIND_NAMES[kind]} (the checkpoint is one)")
    diff = [k for k, s in ref_shapes.items() if k in sd and tuple(sd[k].shape) != tuple(s)]
    diff += [k for k in ref_shapes if k not in sd and "relative_position_index" not in k]
    if diff:
        raise ValueError(
            f"the checkpoint is not a {name!r} state dict: keys missing or of another shape: {_abbrev(diff)}"
        )
    if kind == "vit":
        return ref.blocks[0].attn.num_heads
    return None


# ----------------------------------------------------------------------------------------------
# ViT / DeiT
# ----------------------------------------------------------------------------------------------

# Parts of timm's ViT that only serve classification (dropped).
_VIT_CLASSIFIER = ("cls_token", "dist_token", "norm.", "fc_norm.", "head.", "head_dist.", "attn_pool.", "head_drop.")
# Block parameters detectron2's ViT Block has, under the same names.
_VIT_BLOCK_PARTS = ("norm1.", "attn.qkv.", "attn.proj.", "norm2.", "mlp.fc1.", "mlp.fc2.")


def convert_timm_vit(
    state_dict: Checkpoint,
    *,
    target: Target,
    prefix: str = "backbone.net.",
    num_heads: Optional[int] = None,
    where: str = "",
    trust_pickle: bool = False,
) -> ConvertedCheckpoint:
    """timm ``VisionTransformer`` (ViT, DeiT, distilled DeiT) state dict -> detectron2 ``ViT`` keys.

    Args:
        state_dict: the timm state dict (or a checkpoint wrapping it, see :func:`unwrap_state_dict`).
        target: the detectron2 ViT module, or its state dict / ``{key: shape}`` (keys without prefix).
        prefix: prepended to every key (``"backbone.net."`` in ViTDet models).
        num_heads: the checkpoint's head count if known (a state dict does not record it); checked
            against the target's.
        where: the trunk's path, for error messages.

    Mapping: ``patch_embed.proj``, and per block ``norm1``, ``attn.qkv``, ``attn.proj``, ``norm2``,
    ``mlp.fc1``, ``mlp.fc2`` keep their names. ``pos_embed``: the patch-grid part is taken (after
    the checkpoint's prefix slots), resized bicubically to the target's pretrain grid
    (``pretrain_img_size // patch_size``) when the two differ, and given a class slot (the
    checkpoint's, or zeros) when the target has ``pretrain_use_cls_token=True``; detectron2 drops
    that slot at run time and interpolates the grid to each input. Distilled DeiT: the
    distillation token, its position slot and ``head_dist`` are dropped like the class token, the
    final ``norm``, ``fc_norm`` and ``head``. detectron2-only parameters (``rel_pos_h/w`` of
    ViTDet's relative positions, residual conv blocks) are not in timm checkpoints and keep their
    init. Refused: LayerScale (``ls1``/``ls2``), q/k norms, register tokens, pre-norm and other
    parts detectron2's ViT has no place for -- the converted model would compute another function.
    """
    sd = unwrap_state_dict(state_dict, trust_pickle=trust_pickle)
    if checkpoint_architecture(sd) != "vit":
        raise ValueError(f"not a timm ViT / DeiT state dict (first keys: {_abbrev(list(sd), 5)})")
    src = _source(sd, "vit", num_heads)
    tgt, shapes = _target(target, "vit")
    _check_same_architecture(src, tgt, where)

    ls = sorted(k for k in sd if re.match(r"blocks\.\d+\.ls[12]\.", k))
    if ls:
        raise ValueError(
            f"the checkpoint's ViT blocks have LayerScale ({_abbrev(ls, 2)}; timm init_values, e.g. DeiT-3), "
            f"which detectron2's ViT does not have; pretrain without init_values for detection"
        )
    out: Dict[str, torch.Tensor] = {}
    dropped: List[str] = []
    notes: List[str] = []
    unexpected: List[str] = []
    for key, value in sd.items():
        if key == "pos_embed":
            continue
        if key.startswith(_VIT_CLASSIFIER):
            dropped.append(key)
        elif key.startswith("patch_embed.proj."):
            out[key] = value
        elif key.startswith("blocks.") and key.split(".", 2)[2].startswith(_VIT_BLOCK_PARTS):
            out[key] = value
        else:
            unexpected.append(key)
    if unexpected:
        raise ValueError(
            f"the checkpoint has ViT parts detectron2's ViT has no place for: {_abbrev(unexpected, 4)} "
            f"(e.g. q/k norm, register tokens, pre-norm, patch-embed norm); pretrain a plain ViT / DeiT for detection"
        )

    pos = sd.get("pos_embed")
    if "pos_embed" not in shapes:
        if pos is not None:
            dropped.append("pos_embed")
            notes.append("pos_embed dropped: the target ViT has use_abs_pos=False")
    elif pos is None:
        notes.append("the checkpoint has no pos_embed; the target's keeps its init")
    else:
        tokens = int("cls_token" in sd) + int("dist_token" in sd)
        # Tables without slots for the prefix tokens (timm's no_embed_class, e.g. DeiT-3) are the grid alone.
        n_prefix = tokens if tokens and _square_side(pos.shape[1] - tokens) else 0
        side = _square_side(pos.shape[1] - n_prefix)
        if side is None:
            raise ValueError(f"timm ViT pos_embed of shape {tuple(pos.shape)} is not a square grid "
                             f"(+{tokens} prefix slots)")
        cls_slot = _square_side(shapes["pos_embed"][1]) is None
        new_side = _square_side(shapes["pos_embed"][1] - cls_slot)
        grid = pos[:, n_prefix:]
        if side != new_side:
            # No antialiasing: the kernel detectron2's ViT resizes its own table with at run time.
            grid = resample_abs_pos_embed(grid, [new_side, new_side], num_prefix_tokens=0, antialias=False)
            notes.append(f"pos_embed grid interpolated (bicubic) from {side}x{side} to {new_side}x{new_side}")
        if cls_slot:
            cls_slot = pos[:, :1] if n_prefix else torch.zeros_like(pos[:, :1])
            grid = torch.cat([cls_slot, grid], dim=1)
            if not n_prefix:
                notes.append("the checkpoint's pos_embed has no class slot; the target's (unused at run time) is zero")
        if n_prefix > 1:
            notes.append(f"pos_embed: {n_prefix - 1} slot(s) of the distillation / register tokens dropped")
        out["pos_embed"] = grid
    _check_into_target(out, shapes, "convert_timm_vit")
    if "blocks.0.attn.rel_pos_h" in shapes:
        notes.append("rel_pos_h / rel_pos_w (ViTDet relative positions) are not in timm checkpoints: "
                     "they keep their init")
    return _finish(out, shapes, src, tgt, prefix, dropped, notes, where)


def _finish(out, shapes, src, tgt, prefix, dropped, notes, where, skip_missing=("relative_position_index",)):
    missing = sorted(prefix + k for k in shapes if k not in out and not any(s in k for s in skip_missing))
    at = f" at {where}" if where else ""
    return ConvertedCheckpoint(
        {prefix + k: v for k, v in out.items()},
        source=str(src), target=f"{tgt}{at}", prefix=prefix, missing=missing, dropped=sorted(dropped), notes=notes,
    )


# ----------------------------------------------------------------------------------------------
# Swin
# ----------------------------------------------------------------------------------------------

_SWIN_BUFFERS = ("relative_position_index", "attn_mask")


def convert_timm_swin(
    state_dict: Checkpoint,
    *,
    target: Target,
    prefix: str = "backbone.bottom_up.",
    where: str = "",
    trust_pickle: bool = False,
) -> ConvertedCheckpoint:
    """timm ``SwinTransformer`` (or official-Swin) state dict -> detectron2 ``SwinTransformer`` keys.

    Args:
        state_dict: the timm state dict (or a checkpoint wrapping it).
        target: the detectron2 SwinTransformer module, or its state dict / ``{key: shape}``.
        prefix: prepended to every key (``"backbone.bottom_up."`` in Mask R-CNN FPN models).
        where: the trunk's path, for error messages.

    Mapping: timm >= 0.9 puts PatchMerging at the start of stage i (``layers.{i}.downsample``,
    i >= 1); detectron2, like the official Swin code, at the end of stage i - 1
    (``layers.{i-1}.downsample``): those keys move one stage down. Both concatenate the 2x2
    neighbours in the same channel order -- (row 0, col 0), (row 1, col 0), (row 0, col 1),
    (row 1, col 1) -- so ``reduction`` / ``norm`` weights are copied unchanged (checked
    numerically in tests/test_convert.py). Checkpoints already in the official layout
    (``layers.0.downsample`` present) keep their names. ``relative_position_bias_table`` is
    copied; ``relative_position_index`` / ``attn_mask`` buffers are not (recomputed from the
    window size). timm's final ``norm`` (over the last stage's width, applied to the last stage's
    output) becomes detectron2's ``norm{last}`` when that stage is an output, so the last output
    equals timm's ``forward_features``; the other ``norm{i}`` are detection-only and keep their
    init (weight 1, bias 0). ``head`` is dropped.

    detectron2's Swin always shifts odd blocks, timm does not when a stage's grid is no larger
    than the window (the last stage at 224 px with window 7): the two then differ in those
    blocks, as the official Swin classification and detection code do.
    """
    sd = unwrap_state_dict(state_dict, trust_pickle=trust_pickle)
    if checkpoint_architecture(sd) != "swin":
        raise ValueError(f"not a timm Swin state dict (first keys: {_abbrev(list(sd), 5)})")
    layout = _swin_layout(sd)
    src = _source(sd, "swin")
    tgt, shapes = _target(target, "swin")
    _check_same_architecture(src, tgt, where)
    last = len(tgt.fields["depths"]) - 1
    has_last_norm = f"norm{last}.weight" in shapes

    out: Dict[str, torch.Tensor] = {}
    dropped: List[str] = []
    notes: List[str] = []
    unexpected: List[str] = []
    moved = 0
    for key, value in sd.items():
        if any(key.endswith(b) for b in _SWIN_BUFFERS):
            dropped.append(key)
        elif key.startswith("head."):
            dropped.append(key)
        elif key.startswith("norm."):
            if has_last_norm:
                out[f"norm{last}." + key[len("norm."):]] = value
            else:
                dropped.append(key)
        elif key.startswith("layers.") and ".downsample." in key and layout == "timm":
            stage, rest = key[len("layers."):].split(".", 1)
            out[f"layers.{int(stage) - 1}.{rest}"] = value
            moved += 1
        elif key.startswith(("patch_embed.", "layers.", "absolute_pos_embed")):
            out[key] = value
        else:
            unexpected.append(key)
    if unexpected:
        raise ValueError(
            f"the checkpoint has Swin parts detectron2's SwinTransformer has no place for: {_abbrev(unexpected, 4)}"
        )
    if moved:
        notes.append("PatchMerging moved from the start of stage i (timm) to the end of stage i-1 (detectron2)")
    if has_last_norm and "norm.weight" in sd:
        notes.append(f"timm's final norm -> norm{last} (the last stage's output norm)")
    elif "norm.weight" in sd:
        notes.append(f"timm's final norm dropped: stage {last} is not among the target's out_indices")
    notes.append("relative_position_index / attn_mask buffers are recomputed from the window size, not copied")
    _check_into_target(out, shapes, "convert_timm_swin")
    return _finish(out, shapes, src, tgt, prefix, dropped, notes, where)


# ----------------------------------------------------------------------------------------------
# XCiT
# ----------------------------------------------------------------------------------------------

# Parameters of timm's classifier-only parts, absent from the detection trunk.
_XCIT_CLASSIFIER = ("cls_token", "cls_attn_blocks.", "norm.", "head.", "head_drop.")


def convert_timm_xcit_checkpoint(
    state_dict: Checkpoint,
    prefix: str = "backbone.net.",
    *,
    target: Optional[Target] = None,
    where: str = "",
    trust_pickle: bool = False,
) -> ConvertedCheckpoint:
    """timm or official XCiT ImageNet state dict -> this project's :class:`~condinit_det.modeling.xcit.XCiT` keys.

    Args:
        state_dict: timm's state dict or the official file's ``{"model": ...}`` dict (whose
            positional encoding is named ``pos_embeder``).
        prefix: prepended to every key: ``"backbone.net."`` with the simple feature pyramid,
            ``"backbone.bottom_up.net."`` with XCiT's own neck (:class:`~condinit_det.modeling.xcit.XCiTDeconvPyramid`).
        target: optional XCiT module or its state dict; when given, width, depth, heads and patch
            size are checked and the shapes verified.
        where: the trunk's path, for error messages.

    The trunk's names are timm's, so ``patch_embed.*``, ``pos_embed.*`` and ``blocks.*`` are
    copied unchanged; the class token, class-attention layers, final norm and head are dropped.
    The neck of :class:`XCiTDeconvPyramid` is not in ImageNet checkpoints and keeps its init.
    Any other key raises :class:`UnexpectedCheckpointKey` (a KeyError and a ValueError).
    """
    sd = unwrap_state_dict(state_dict, trust_pickle=trust_pickle)
    out: Dict[str, torch.Tensor] = {}
    dropped: List[str] = []
    for key, value in sd.items():
        if key.startswith(_XCIT_CLASSIFIER):
            dropped.append(key)
            continue
        if key.startswith("pos_embeder."):
            key = "pos_embed." + key[len("pos_embeder."):]
        if not key.startswith(("patch_embed.", "pos_embed.", "blocks.")):
            raise UnexpectedCheckpointKey(
                f"unexpected key {key!r} in an XCiT checkpoint; expected patch_embed.*, pos_embed(er).*, "
                f"blocks.* or classifier parts {_XCIT_CLASSIFIER}"
            )
        out[key] = value
    if not out:
        raise ValueError("no XCiT trunk parameters (patch_embed.*, pos_embed.*, blocks.*) in the checkpoint")
    src = _source(out, "xcit")
    if target is None:
        return ConvertedCheckpoint({prefix + k: v for k, v in out.items()}, source=str(src), target="(not checked)",
                                   prefix=prefix, dropped=sorted(dropped))
    tgt, shapes = _target(target, "xcit")
    _check_same_architecture(src, tgt, where)
    _check_into_target(out, shapes, "convert_timm_xcit_checkpoint")
    return _finish(out, shapes, src, tgt, prefix, dropped, [], where)


# ----------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------


def convert_timm_checkpoint(
    state_dict: Checkpoint,
    model: nn.Module,
    *,
    timm_model_name: Optional[str] = None,
    timm_model_kwargs: Optional[Mapping[str, Any]] = None,
    trust_pickle: bool = False,
) -> ConvertedCheckpoint:
    """Convert a timm ImageNet checkpoint for a built detectron2 model; keys are ``model.state_dict()`` keys.

    Finds the one detectron2 ViT, SwinTransformer or XCiT in ``model`` (e.g. ``backbone.net``,
    ``backbone.bottom_up`` or ``backbone.bottom_up.net``), recognizes the checkpoint's
    architecture from its keys (:func:`checkpoint_architecture`) and converts with the trunk's
    path as prefix. A checkpoint of another architecture, width, depth, head count, window or
    patch size raises one ValueError saying what the checkpoint is and what the model expects.

    Args:
        state_dict: a timm state dict, or a checkpoint wrapping one (``{"model": ...}``,
            ``{"state_dict": ...}``, ``module.`` prefixes), or the path of a checkpoint file
            (``.safetensors``, ``.pth``; a pretraining run's ``model_final`` file also gives
            ``timm_model_name`` and ``timm_model_kwargs`` when they are not passed).
        model: the built model (before or after the arm; the converted weights replace it where
            they exist).
        timm_model_name: the timm model the checkpoint was trained as, if known (e.g.
            ``"vit_base_patch16_224"``): the checkpoint is checked against it (timm's defaults for
            that name, classifier and position table aside), which for ViT adds the head count, which
            a ViT state dict does not record. Checkpoints of timm's training script: pass
            ``ckpt["state_dict_ema"]`` explicitly to convert the EMA weights (``"state_dict"`` is
            taken otherwise).
        timm_model_kwargs: the keyword arguments it was created with (``timm.create_model(name,
            **kwargs)``), when they change its architecture (e.g. a tiny ViT from a ViT name).
        trust_pickle: load a ``.pkl`` file, or a ``.pth`` that needs full unpickling (either can
            run code stored in it); refused with :class:`~condinit_det.utils.checkpoint_io.UnsafeCheckpointError`
            otherwise.

    Returns:
        :class:`ConvertedCheckpoint`: load with ``model.load_state_dict(converted, strict=False)``;
        ``converted.missing`` lists the model's trunk keys it does not provide (they keep their
        init), ``converted.dropped`` the checkpoint keys not used, ``converted.notes`` the rest.
        The summary is logged at INFO.
    """
    if isinstance(state_dict, (str, os.PathLike)):
        state_dict = _read(state_dict, trust_pickle)
        if isinstance(state_dict, Mapping):  # the metadata of a pretraining run's model_final file
            timm_model_name = timm_model_name or state_dict.get("timm_model")
            timm_model_kwargs = timm_model_kwargs if timm_model_kwargs is not None else state_dict.get("model_kwargs")
    sd = unwrap_state_dict(state_dict)
    where, trunk, kind = find_trunk(model)
    src_kind = checkpoint_architecture(sd)
    if src_kind is None:
        tgt, _ = _target(trunk, kind)
        raise ValueError(
            f"checkpoint/model mismatch: the checkpoint is not a timm ViT / DeiT, Swin or XCiT state dict "
            f"(first keys: {_abbrev(list(sd), 5)}) but the model's trunk at {where or '<root>'} is a {tgt}"
        )
    num_heads = _timm_reference(timm_model_name, sd, src_kind, timm_model_kwargs) if timm_model_name else None
    if src_kind != kind:
        _check_same_architecture(_source(sd, src_kind, num_heads), _target(trunk, kind)[0], where or "<root>")
    prefix = f"{where}." if where else ""
    if kind == "vit":
        converted = convert_timm_vit(sd, target=trunk, prefix=prefix, num_heads=num_heads, where=where or "<root>")
    elif kind == "swin":
        converted = convert_timm_swin(sd, target=trunk, prefix=prefix, where=where or "<root>")
    else:
        converted = convert_timm_xcit_checkpoint(sd, prefix, target=trunk, where=where or "<root>")
    model_keys = model.state_dict().keys()
    stray = [k for k in converted if k not in model_keys]
    if stray:  # cannot happen when the trunk's own keys matched; guards renamed submodules
        raise ValueError(f"converted keys not in the model: {_abbrev(stray)}")
    converted.missing = sorted(k for k in model_keys if k not in converted and not k.endswith(_SWIN_BUFFERS))
    logger.info(converted.summary())
    return converted
