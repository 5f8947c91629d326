"""Instance-mask head of a DETR-style detector (DETR, Sec. 4.4 and Fig. 8): per query, per-head attention maps over
the encoder memory and the projected features, upsampled FPN-style to one mask logit map. :class:`MaskAttentionMap`
has query/key projections only and is not an ``nn.MultiheadAttention``, so it is not an arm site.
"""

import math
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MaskAttentionMap", "MaskHead"]


def _conv_block(in_channels: int, out_channels: int) -> list:
    """3x3 convolution, GroupNorm (up to 8 groups), ReLU."""
    return [
        nn.Conv2d(in_channels, out_channels, 3, padding=1),
        nn.GroupNorm(math.gcd(8, out_channels), out_channels),
        nn.ReLU(inplace=True),
    ]


class MaskAttentionMap(nn.Module):
    """Per-head attention of each query over the memory, softmax over the spatial positions.

    Args:
        dim: width of the decoder outputs, the encoder memory and both projections (split into ``num_heads`` heads).
    """

    def __init__(self, *, dim: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"hidden_dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.num_heads = num_heads
        self.query_proj = nn.Linear(dim, dim)
        self.key_proj = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)
        self.scale = (dim // num_heads) ** -0.5
        for lin in (self.query_proj, self.key_proj):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(
        self, queries: torch.Tensor, batch_idx: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """queries [N, dim], batch_idx int64 [N] (each one's image), memory [B, dim, H, W], mask bool [B, H, W] (True on
        padding) -> [N, num_heads, H, W] attention weights summing to 1 over the valid cells."""
        h, w = memory.shape[-2:]
        q = self.query_proj(queries).unflatten(-1, (self.num_heads, -1)) * self.scale
        k = self.key_proj(memory.flatten(2).transpose(1, 2)).unflatten(-1, (self.num_heads, -1))
        # Score each query against its own image's memory only.
        k = k[batch_idx]  # [N, HW, heads, dh]
        logits = torch.einsum("nhd,nphd->nhp", q, k)
        logits = logits.masked_fill(mask.flatten(1)[batch_idx][:, None, :], float("-inf"))
        weights = self.dropout(logits.softmax(-1))
        return weights.unflatten(-1, (h, w))


class MaskHead(nn.Module):
    """Attention maps + projected features -> convolutional upsampling decoder -> mask logits.

    Args:
        hidden_dim: width D of decoder outputs, encoder memory and projected features.
        num_heads: attention maps per query.
        fpn_channels: channels of the backbone features fed at each upsampling stage, coarsest first (empty: none).
        num_upsample: x2 upsampling stages without ``fpn_channels`` (with them: one stage per feature).
        conv_dims: the decoder's widths, ``2 + stages`` of them; None halves D per stage (at least 8 channels).
    """

    def __init__(
        self,
        *,
        hidden_dim: int,
        num_heads: int = 8,
        fpn_channels: Sequence[int] = (),
        num_upsample: int = 2,
        conv_dims: Optional[Sequence[int]] = None,
        dropout: float = 0.0,
    ):
        super().__init__()
        fpn_channels = list(fpn_channels)
        num_stages = len(fpn_channels) if fpn_channels else num_upsample
        if num_stages < 0:
            raise ValueError(f"num_upsample must be >= 0, got {num_upsample}")
        if conv_dims is None:
            conv_dims = [max(hidden_dim // 2**i, 8) for i in range(num_stages + 2)]
        conv_dims = list(conv_dims)
        if len(conv_dims) != num_stages + 2:
            raise ValueError(
                f"conv_dims must have {num_stages + 2} entries (2 + one per upsampling stage), got {len(conv_dims)}"
            )
        self.fpn_channels = fpn_channels
        self.attention = MaskAttentionMap(dim=hidden_dim, num_heads=num_heads, dropout=dropout)
        self.stem = nn.Sequential(
            *_conv_block(hidden_dim + num_heads, conv_dims[0]), *_conv_block(conv_dims[0], conv_dims[1])
        )
        self.adapters = nn.ModuleList([nn.Conv2d(c, conv_dims[i + 1], 1) for i, c in enumerate(fpn_channels)])
        self.stages = nn.ModuleList(
            [nn.Sequential(*_conv_block(conv_dims[i + 1], conv_dims[i + 2])) for i in range(num_stages)]
        )
        self.predictor = nn.Conv2d(conv_dims[-1], 1, 3, padding=1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_uniform_(m.weight, a=1)
                nn.init.zeros_(m.bias)

    def forward(
        self,
        queries: torch.Tensor,
        batch_idx: torch.Tensor,
        memory: torch.Tensor,
        mask: torch.Tensor,
        features: torch.Tensor,
        fpn_features: Sequence[torch.Tensor] = (),
    ) -> torch.Tensor:
        """
        Args:
            queries: [N, D] decoder outputs of the queries to segment; batch_idx: int64 [N].
            memory: [B, D, H, W] encoder output; mask: bool [B, H, W], True on padding.
            features: [B, D, H, W] projected backbone features (transformer input).
            fpn_features: one [B, C_i, H_i, W_i] map per entry of ``fpn_channels``.
        Returns:
            [N, H_out, W_out] mask logits at the last FPN feature's size, else H * 2**stages.
        """
        attn = self.attention(queries, batch_idx, memory, mask)
        x = self.stem(torch.cat([features[batch_idx], attn], dim=1))
        for i, stage in enumerate(self.stages):
            if self.fpn_channels:
                skip = self.adapters[i](fpn_features[i])
                x = F.interpolate(x, size=skip.shape[-2:], mode="nearest") + skip[batch_idx]
            else:
                x = F.interpolate(x, scale_factor=2.0, mode="nearest")
            x = stage(x)
        return self.predictor(x).squeeze(1)
