"""XCiT as a detectron2 backbone (timm's trunk and parameter names, no classification parts) and the neck of XCiT's
detection code (docs/configs.md#coco-configs)."""

from functools import partial
from typing import Dict, Optional, Sequence

import torch
import torch.nn as nn
import torch.utils.checkpoint
from detectron2.modeling import Backbone
from timm.layers import trunc_normal_
from timm.models.xcit import ConvPatchEmbed, PositionalEncodingFourier, XCABlock

__all__ = ["XCiT", "XCiTDeconvPyramid"]

# XCiT's token norm; one shared factory as the default, since it holds no state.
_DEFAULT_NORM_LAYER = partial(nn.LayerNorm, eps=1e-6)


class XCiT(Backbone):
    """XCiT trunk: images (B, 3, H, W), H and W multiples of ``patch_size`` -> (B, embed_dim, H / patch_size,
    W / patch_size) maps. Its attention is across channels, so any input size works without interpolation."""

    def __init__(
        self,
        *,
        patch_size: int = 16,
        in_chans: int = 3,
        embed_dim: int = 384,
        depth: int = 12,
        num_heads: int = 8,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_path_rate: float = 0.0,
        eta: float = 1.0,
        use_pos_embed: bool = True,
        norm_layer=_DEFAULT_NORM_LAYER,
        act_layer=nn.GELU,
        sync_bn: bool = False,
        use_act_checkpoint: bool = False,
        out_feature: str = "last_feat",
        out_indices: Optional[Sequence[int]] = None,
    ):
        """
        Args:
            patch_size: 16 or 8 (the strides timm's ConvPatchEmbed supports).
            embed_dim: token width D, divisible by 8 (patch-embed stem widths) and by ``num_heads``.
            drop_path_rate: stochastic depth, the same rate in every block (XCiT's rule).
            eta: LayerScale init value (XCiT-S12 uses 1.0, deeper models 1e-5).
            sync_bn: SyncBatchNorm in the patch embedding and LPI, under the same parameter names.
            out_feature: name of the output when ``out_indices`` is None (the last block's).
            out_indices: blocks (negative: from the end) whose outputs are returned as ``block{i}`` maps, e.g.
                ``(3, 5, 7, 11)`` for :class:`XCiTDeconvPyramid`; blocks after the last one listed are not run.
        """
        super().__init__()
        if patch_size not in (8, 16):
            raise ValueError(f"XCiT patch_size must be 8 or 16 (ConvPatchEmbed strides), got {patch_size}")
        if embed_dim % 8 != 0:
            raise ValueError(f"XCiT embed_dim must be divisible by 8 (patch-embed stem widths), got {embed_dim}")
        if num_heads <= 0 or embed_dim % num_heads != 0:
            raise ValueError(f"XCiT embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        if depth <= 0:
            raise ValueError(f"XCiT depth must be positive, got {depth}")

        self.patch_size = patch_size
        self.embed_dim = embed_dim
        self.use_act_checkpoint = use_act_checkpoint

        # img_size only sets an unused num_patches attribute; the stem is fully convolutional.
        self.patch_embed = ConvPatchEmbed(
            img_size=224, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim, act_layer=act_layer
        )
        self.pos_embed = PositionalEncodingFourier(dim=embed_dim) if use_pos_embed else None
        self.blocks = nn.ModuleList(
            [
                XCABlock(
                    dim=embed_dim,
                    num_heads=num_heads,
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    drop_path=drop_path_rate,
                    act_layer=act_layer,
                    norm_layer=norm_layer,
                    eta=eta,
                )
                for _ in range(depth)
            ]
        )

        if out_indices is None:
            self._out_blocks = {depth - 1: out_feature}
        else:
            normalized = [int(i) + depth if int(i) < 0 else int(i) for i in out_indices]
            if not normalized or len(set(normalized)) < len(normalized) or not all(0 <= i < depth for i in normalized):
                raise ValueError(
                    f"XCiT out_indices must be distinct blocks in 0..{depth - 1} (or negative, from the "
                    f"end), got {tuple(out_indices)} for depth {depth}; None: the last block"
                )
            self._out_blocks = {i: f"block{i}" for i in sorted(normalized)}
        self.out_indices = tuple(self._out_blocks)
        self._out_features = list(self._out_blocks.values())
        self._out_feature_channels = {name: embed_dim for name in self._out_features}
        self._out_feature_strides = {name: patch_size for name in self._out_features}

        # timm's Xcit init: truncated normal (std 0.02) on every Linear, zero bias; convolutions
        # and norms keep PyTorch's defaults.
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.constant_(m.bias, 0)
        if sync_bn:
            # Replaces modules in place under the same names, so state_dict keys are unchanged.
            nn.SyncBatchNorm.convert_sync_batchnorm(self)

    @property
    def size_divisibility(self) -> int:
        return self.patch_size

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        B, _, H, W = x.shape
        if H % self.patch_size or W % self.patch_size:
            raise ValueError(
                f"XCiT input height and width must be multiples of patch_size={self.patch_size}, "
                f"got {H}x{W}; pad the images (detectron2 does so via size_divisibility)"
            )
        x, (Hp, Wp) = self.patch_embed(x)  # (B, N, C), N = Hp * Wp
        if self.pos_embed is not None:
            # (B, C, Hp, Wp) -> (B, N, C), same token order as the patch embedding's flatten.
            x = x + self.pos_embed(B, Hp, Wp).reshape(B, -1, x.shape[1]).permute(0, 2, 1)
        outputs = {}
        for i, blk in enumerate(self.blocks[: self.out_indices[-1] + 1]):
            if self.use_act_checkpoint and self.training:
                x = torch.utils.checkpoint.checkpoint(blk, x, Hp, Wp, use_reentrant=False)
            else:
                x = blk(x, Hp, Wp)
            if i in self._out_blocks:
                # (B, N, C) -> (B, C, Hp, Wp), tokens in row-major order as the patch embedding made them
                outputs[self._out_blocks[i]] = x.transpose(1, 2).reshape(B, self.embed_dim, Hp, Wp)
        return outputs


class XCiTDeconvPyramid(Backbone):
    """XCiT's own detection neck (facebookresearch/xcit ``detection/backbone/xcit.py``: its modules ``fpn1``..``fpn4``
    and their default init): four block outputs at the patch stride, shallowest first, -> maps of the trunk width at
    strides 4, 8, 16, 32, for a :class:`detectron2.modeling.FPN` on top. The trunk sits under ``net``, so the attention
    sites of an FPN model are ``backbone.bottom_up.net.blocks.{i}.attn``.
    """

    def __init__(self, net: XCiT, *, sync_bn: bool = False, out_features: Sequence[str] = ("s4", "s8", "s16", "s32")):
        """
        Args:
            net: an :class:`XCiT` built with four ``out_indices`` (e.g. ``(3, 5, 7, 11)``).
            sync_bn: SyncBatchNorm instead of BatchNorm2d after the first deconvolution (as XCiT's code).
            out_features: names of the stride 4, 8, 16, 32 outputs, for ``FPN(in_features=...)``.
        """
        super().__init__()
        if not isinstance(net, XCiT):
            raise TypeError(f"XCiTDeconvPyramid takes an XCiT trunk, got {type(net).__name__}")
        self.in_features = list(net._out_features)
        if len(self.in_features) != 4:
            raise ValueError(
                f"XCiTDeconvPyramid needs an XCiT with four out_indices (e.g. (3, 5, 7, 11)), got {self.in_features}"
            )
        out_features = list(out_features)
        if len(out_features) != 4 or len(set(out_features)) != 4:
            raise ValueError(f"XCiTDeconvPyramid out_features must be four distinct names, got {out_features}")
        self.net = net
        dim = net.embed_dim
        if net.patch_size == 16:
            norm = nn.SyncBatchNorm(dim) if sync_bn else nn.BatchNorm2d(dim)
            self.fpn1 = nn.Sequential(
                nn.ConvTranspose2d(dim, dim, kernel_size=2, stride=2),
                norm,
                nn.GELU(),
                nn.ConvTranspose2d(dim, dim, kernel_size=2, stride=2),
            )
            self.fpn2 = nn.Sequential(nn.ConvTranspose2d(dim, dim, kernel_size=2, stride=2))
            self.fpn3 = nn.Identity()
            self.fpn4 = nn.MaxPool2d(kernel_size=2, stride=2)
        else:  # patch 8 (XCiT only allows 8 and 16)
            self.fpn1 = nn.Sequential(nn.ConvTranspose2d(dim, dim, kernel_size=2, stride=2))
            self.fpn2 = nn.Identity()
            self.fpn3 = nn.Sequential(nn.MaxPool2d(kernel_size=2, stride=2))
            self.fpn4 = nn.Sequential(nn.MaxPool2d(kernel_size=4, stride=4))

        self._out_features = out_features
        self._out_feature_channels = {name: dim for name in out_features}
        self._out_feature_strides = dict(zip(out_features, (4, 8, 16, 32)))

    @property
    def size_divisibility(self) -> int:
        # The stride-32 level max-pools the patch grid: pad to 32 so every level has exactly its stride.
        return 32

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        feats = self.net(x)
        ops = (self.fpn1, self.fpn2, self.fpn3, self.fpn4)
        return {name: op(feats[src]) for name, op, src in zip(self._out_features, ops, self.in_features)}
