"""Encoder-decoder transformer of a DETR-style detector on ``torch.nn.MultiheadAttention`` (the arms' ``mha``
layout: ``encoder.layers.N.self_attn``, ``decoder.layers.N.{self,cross}_attn``); sequences are [B, L, D].
"""

import copy
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Transformer"]

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}


class TransformerLayer(nn.Module):
    """Self-attention, cross-attention to the encoder memory (decoder layers only) and feed-forward, each a residual
    sublayer with its own norm (``norm{k}`` for the k-th) and the one dropout. Positional encodings are added to
    queries and keys only (not values) at every layer, as in DETR."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int,
        dropout: float,
        activation: str,
        normalize_before: bool,
        *,
        cross_attention: bool,
    ):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
        self.self_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=True)
        if cross_attention:
            self.cross_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=True)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        for k in range(1, 4 if cross_attention else 3):
            self.add_module(f"norm{k}", nn.LayerNorm(d_model))
        self.dropout = nn.Dropout(dropout)
        self.activation = _ACTIVATIONS[activation]
        self.normalize_before = normalize_before

    def _ffn(self, x):
        return self.linear2(self.dropout(self.activation(self.linear1(x))))

    def forward(
        self,
        x: torch.Tensor,
        *,
        pos: torch.Tensor,
        key_padding_mask: Optional[torch.Tensor] = None,
        attn_mask: Optional[torch.Tensor] = None,
        memory: Optional[torch.Tensor] = None,
        memory_pos: Optional[torch.Tensor] = None,
        memory_key_padding_mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """
        Args:
            x, pos: [B, L, D] tokens and their positional encoding.
            key_padding_mask: bool [B, L], True on padding. attn_mask: bool [L, L], True where i may not attend to j.
            memory, memory_pos, memory_key_padding_mask: [B, HW, D] encoder output, its positional encoding and
                bool [B, HW] padding, for the cross-attention.
        """

        def self_attention(y):
            q = k = y + pos
            return self.self_attn(
                q, k, value=y, key_padding_mask=key_padding_mask, attn_mask=attn_mask, need_weights=False
            )[0]

        def cross_attention(y):
            return self.cross_attn(
                y + pos, memory + memory_pos, value=memory, key_padding_mask=memory_key_padding_mask, need_weights=False
            )[0]

        sublayers = (self_attention, self._ffn) if memory is None else (self_attention, cross_attention, self._ffn)
        for k, sublayer in enumerate(sublayers, start=1):
            norm = getattr(self, f"norm{k}")
            if self.normalize_before:
                x = x + self.dropout(sublayer(norm(x)))
            else:
                x = norm(x + self.dropout(sublayer(x)))
        return x


class _Stack(nn.Module):
    """``num_layers`` copies of ``layer`` and the norm after them (``None``: none)."""

    def __init__(self, layer: TransformerLayer, num_layers: int, norm: Optional[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleList([copy.deepcopy(layer) for _ in range(num_layers)])
        self.norm = norm


class Transformer(nn.Module):
    """DETR encoder-decoder: width ``d_model``, ``nhead`` heads, FFN width ``dim_feedforward``, ``activation`` "relu"
    or "gelu", pre-norm layers with ``normalize_before`` (DETR's are post-norm); the encoder may have 0 layers."""

    def __init__(
        self,
        *,
        d_model: int = 256,
        nhead: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str = "relu",
        normalize_before: bool = False,
    ):
        super().__init__()
        if num_decoder_layers < 1 or num_encoder_layers < 0:
            raise ValueError(
                f"need num_decoder_layers >= 1 and num_encoder_layers >= 0, got "
                f"{num_decoder_layers} and {num_encoder_layers}"
            )
        if d_model % nhead:
            raise ValueError(f"d_model ({d_model}) must be divisible by nhead ({nhead})")
        layer = (d_model, nhead, dim_feedforward, dropout, activation, normalize_before)
        self.encoder = _Stack(
            TransformerLayer(*layer, cross_attention=False),
            num_encoder_layers,
            nn.LayerNorm(d_model) if normalize_before else None,
        )
        # The decoder's outputs after every layer are normalized: they feed the auxiliary decoding losses.
        self.decoder = _Stack(TransformerLayer(*layer, cross_attention=True), num_decoder_layers, nn.LayerNorm(d_model))
        self.d_model = d_model
        # Xavier-uniform for every matrix, as in DETR; this is the "default" arm of every
        # attention site in the transformer (in_proj and out_proj alike).
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def forward(
        self,
        src: torch.Tensor,
        mask: torch.Tensor,
        query_embed: torch.Tensor,
        pos: torch.Tensor,
        query_attn_mask: Optional[torch.Tensor] = None,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """
        Args:
            src, pos: [B, D, H, W] projected features and their positional encoding; mask: bool [B, H, W], True on
                padding; query_embed: [Q, D] object queries; query_attn_mask: bool [Q, Q] or None, True where query i
                may not attend to query j.
        Returns:
            hs [num_decoder_layers, B, Q, D] decoder outputs and memory [B, D, H, W] encoder output.
        """
        b, d, h, w = src.shape
        memory = src.flatten(2).transpose(1, 2)
        pos_seq = pos.flatten(2).transpose(1, 2)
        mask_seq = mask.flatten(1)
        for layer in self.encoder.layers:
            memory = layer(memory, pos=pos_seq, key_padding_mask=mask_seq)
        if self.encoder.norm is not None:
            memory = self.encoder.norm(memory)
        query_pos = query_embed.unsqueeze(0).expand(b, -1, -1)
        # Decoder input starts at zero: the object queries enter only as positional encodings.
        tgt = torch.zeros_like(query_pos)
        hs = []
        for layer in self.decoder.layers:
            tgt = layer(
                tgt,
                pos=query_pos,
                attn_mask=query_attn_mask,
                memory=memory,
                memory_pos=pos_seq,
                memory_key_padding_mask=mask_seq,
            )
            hs.append(self.decoder.norm(tgt))
        return torch.stack(hs), memory.transpose(1, 2).reshape(b, d, h, w)
