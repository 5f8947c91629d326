"""2D sine positional encoding of a padded feature map (DETR, Sec. 3.2 and A.4)."""

import math

import torch
from torch import nn

__all__ = ["PositionEmbeddingSine"]


class PositionEmbeddingSine(nn.Module):
    """Fixed sine/cosine encoding of the (y, x) position of every valid feature-map cell, counted over the valid cells
    only (a padded image is encoded as alone) and, with ``normalize``, rescaled to (0, scale] per image. Channels:
    y's half, then x's, each sines (even) and cosines (odd) of geometrically spaced frequencies.
    """

    def __init__(
        self, num_pos_feats: int = 128, temperature: float = 10000.0, normalize: bool = True, scale: float = 2 * math.pi
    ):
        super().__init__()
        if num_pos_feats <= 0 or num_pos_feats % 2:
            raise ValueError(f"num_pos_feats must be a positive even integer, got {num_pos_feats}")
        self.num_pos_feats = num_pos_feats
        self.temperature = temperature
        self.normalize = normalize
        self.scale = scale

    def forward(self, mask: torch.Tensor) -> torch.Tensor:
        """mask: bool [B, H, W], True on padded cells -> float [B, 2 * num_pos_feats, H, W]."""
        valid = (~mask).float()
        y = valid.cumsum(1)
        x = valid.cumsum(2)
        if self.normalize:
            eps = 1e-6
            # The last cumulative value of each row/column is the number of valid cells.
            y = y / (y[:, -1:, :] + eps) * self.scale
            x = x / (x[:, :, -1:] + eps) * self.scale

        return self._encode(y, x).permute(0, 3, 1, 2).contiguous()

    def encode_points(self, points: torch.Tensor) -> torch.Tensor:
        """points [..., 2] as (x, y) fractions of the valid image in [0, 1] -> [..., 2 * num_pos_feats], encoded as
        the cell at that normalized position (with ``normalize``), so that points and the memory share one space."""
        scale = self.scale if self.normalize else 1.0
        return self._encode(points[..., 1] * scale, points[..., 0] * scale)

    def _encode(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """y, x: [...] positions -> [..., 2 * num_pos_feats] (y half first)."""
        idx = torch.arange(self.num_pos_feats, dtype=torch.float32, device=y.device)
        freq = self.temperature ** (2 * torch.div(idx, 2, rounding_mode="floor") / self.num_pos_feats)
        halves = [position[..., None] / freq for position in (y, x)]
        # Interleave sin (even channels) and cos (odd channels).
        return torch.cat(
            [torch.stack((h[..., 0::2].sin(), h[..., 1::2].cos()), dim=-1).flatten(-2) for h in halves], dim=-1
        )
