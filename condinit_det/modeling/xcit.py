"""XCiT (Cross-Covariance Image Transformer) as a single-scale detectron2 backbone.

The trunk is timm's XCiT (``timm.models.xcit``): a convolutional patch embedding
(``ConvPatchEmbed``, stride 8 or 16), Fourier positional encoding, and ``XCABlock``s
(cross-covariance attention ``XCA`` + local patch interaction ``LPI`` + MLP, each with
LayerScale). The classification-only parts (class token, class-attention layers, final
norm, head) are dropped. The output is one feature map at the patch stride, like ViTDet's
``last_feat``; :class:`detectron2.modeling.SimpleFeaturePyramid` builds the pyramid from it.
XCiT's own detection neck (deconvolutions on blocks 3/5/7/11 + FPN) is deliberately not used,
so that XCiT and ViT detectors differ only in the trunk.

Parameter names are timm's (``patch_embed.*``, ``pos_embed.*``, ``blocks.{i}.*``), so a
timm / official XCiT ImageNet checkpoint loads after :func:`convert_timm_xcit_checkpoint`
adds the model prefix (``backbone.net.`` in the Mask R-CNN configs of this project).
"""
from functools import partial
from typing import Dict, Mapping

import torch
import torch.nn as nn
import torch.utils.checkpoint
from timm.layers import trunc_normal_
from timm.models.xcit import ConvPatchEmbed, PositionalEncodingFourier, XCABlock

from detectron2.layers import ShapeSpec
from detectron2.modeling import Backbone

__all__ = ["XCiT", "convert_timm_xcit_checkpoint"]


class XCiT(Backbone):
    """Single-scale XCiT backbone.

    Input: images (B, 3, H, W) with H and W multiples of ``patch_size``.
    Output: ``{out_feature: (B, embed_dim, H / patch_size, W / patch_size)}``.
    XCA attends across channels (a dh x dh map per head), so cost is linear in H*W and any
    input size works without interpolating position embeddings.
    """

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
        norm_layer=partial(nn.LayerNorm, eps=1e-6),
        act_layer=nn.GELU,
        sync_bn: bool = False,
        use_act_checkpoint: bool = False,
        out_feature: str = "last_feat",
    ):
        """
        Args:
            patch_size: 16 or 8 (the strides timm's ConvPatchEmbed supports).
            in_chans: input image channels.
            embed_dim: token width D; must be divisible by 8 (patch-embed stem widths) and by
                ``num_heads``.
            depth: number of XCA blocks.
            num_heads: XCA heads; head width dh = embed_dim / num_heads.
            mlp_ratio: MLP hidden width / embed_dim.
            qkv_bias: bias on the fused qkv projection.
            drop_path_rate: stochastic depth, the same rate in every block (XCiT's rule,
                unlike ViT's linear ramp).
            eta: LayerScale init value (gamma1/2/3). XCiT-S12 uses 1.0, deeper models 1e-5.
            use_pos_embed: add the Fourier positional encoding after the patch embedding.
            norm_layer: token norm of the blocks.
            act_layer: activation in patch embedding, LPI and MLP.
            sync_bn: convert the BatchNorm2d layers of the patch embedding and LPI to
                SyncBatchNorm; detection batches are ~2 images per GPU, too few for per-GPU
                batch statistics. Parameter names are unchanged.
            use_act_checkpoint: recompute block activations in the backward pass to save memory.
            out_feature: name of the output feature.
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
        self.num_heads = num_heads
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

        self._out_features = [out_feature]
        self._out_feature_channels = {out_feature: embed_dim}
        self._out_feature_strides = {out_feature: patch_size}

        # timm's Xcit init: truncated normal (std 0.02) on every Linear, zero bias; convolutions
        # and norms keep PyTorch's defaults.
        self.apply(self._init_weights)
        if sync_bn:
            # Replaces modules in place under the same names, so state_dict keys are unchanged.
            nn.SyncBatchNorm.convert_sync_batchnorm(self)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.constant_(m.bias, 0)

    @property
    def size_divisibility(self) -> int:
        return self.patch_size

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        """
        Args:
            x: (B, in_chans, H, W), H and W multiples of ``patch_size``.
        Returns:
            dict with one entry ``out_feature``: (B, embed_dim, H / patch_size, W / patch_size).
        """
        if x.dim() != 4:
            raise ValueError(f"XCiT expects images of shape (B, C, H, W), got shape {tuple(x.shape)}")
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
        for blk in self.blocks:
            if self.use_act_checkpoint and self.training:
                x = torch.utils.checkpoint.checkpoint(blk, x, Hp, Wp, use_reentrant=False)
            else:
                x = blk(x, Hp, Wp)
        x = x.transpose(1, 2).reshape(B, self.embed_dim, Hp, Wp)
        return {self._out_features[0]: x}

    def output_shape(self) -> Dict[str, ShapeSpec]:
        name = self._out_features[0]
        return {name: ShapeSpec(channels=self._out_feature_channels[name], stride=self._out_feature_strides[name])}


# Parameters of timm's classifier-only parts, absent from the detection trunk.
_CLASSIFIER_PREFIXES = ("cls_token", "cls_attn_blocks.", "norm.", "head.", "head_drop.")


def convert_timm_xcit_checkpoint(
    state_dict: Mapping[str, torch.Tensor], prefix: str = "backbone.net."
) -> Dict[str, torch.Tensor]:
    """Map a timm or official XCiT ImageNet state dict to this backbone's names inside a model.

    Accepts timm's state dict or the official file's ``{"model": ...}`` dict (whose positional
    encoding is named ``pos_embeder``). Drops the class token, class-attention layers, final norm
    and head, and prepends ``prefix``. Save the result as ``{"model": converted}`` and point
    ``train.init_checkpoint`` at it (load without matching heuristics: they would map timm's final
    ``norm.*`` onto the pyramid's norms).
    """
    if "model" in state_dict and not isinstance(state_dict["model"], torch.Tensor):
        state_dict = state_dict["model"]
    converted = {}
    for key, value in state_dict.items():
        if key.startswith(_CLASSIFIER_PREFIXES):
            continue
        if key.startswith("pos_embeder."):
            key = "pos_embed." + key[len("pos_embeder."):]
        if not key.startswith(("patch_embed.", "pos_embed.", "blocks.")):
            raise KeyError(
                f"unexpected key {key!r} in an XCiT checkpoint; expected patch_embed.*, pos_embed(er).*, "
                f"blocks.* or classifier parts {_CLASSIFIER_PREFIXES}"
            )
        converted[prefix + key] = value
    if not converted:
        raise ValueError("no XCiT trunk parameters (patch_embed.*, pos_embed.*, blocks.*) in the checkpoint")
    return converted
