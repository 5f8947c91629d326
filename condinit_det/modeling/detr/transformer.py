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


def _activation(name: str):
    if name not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {name!r}")
    return _ACTIVATIONS[name]


def _with_pos(x: torch.Tensor, pos: Optional[torch.Tensor]) -> torch.Tensor:
    return x if pos is None else x + pos


class TransformerEncoderLayer(nn.Module):
    """Self-attention + feed-forward block. Positional encodings are added to queries and keys
    only (not values) at every layer, as in DETR."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str = "relu",
        normalize_before: bool = False,
    ):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=True)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.activation = _activation(activation)
        self.normalize_before = normalize_before

    def _attn(self, x, pos, key_padding_mask):
        q = k = _with_pos(x, pos)
        return self.self_attn(q, k, value=x, key_padding_mask=key_padding_mask, need_weights=False)[0]

    def _ffn(self, x):
        return self.linear2(self.dropout(self.activation(self.linear1(x))))

    def forward(
        self, src: torch.Tensor, *, pos: Optional[torch.Tensor] = None, key_padding_mask: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """src, pos: [B, HW, D]; key_padding_mask: bool [B, HW], True on padding."""
        if self.normalize_before:
            src = src + self.dropout1(self._attn(self.norm1(src), pos, key_padding_mask))
            return src + self.dropout2(self._ffn(self.norm2(src)))
        src = self.norm1(src + self.dropout1(self._attn(src, pos, key_padding_mask)))
        return self.norm2(src + self.dropout2(self._ffn(src)))


class TransformerDecoderLayer(nn.Module):
    """Query self-attention, cross-attention to the encoder memory, feed-forward."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str = "relu",
        normalize_before: bool = False,
    ):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=True)
        self.cross_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=True)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)
        self.activation = _activation(activation)
        self.normalize_before = normalize_before

    def _self(self, x, query_pos, attn_mask):
        q = k = _with_pos(x, query_pos)
        return self.self_attn(q, k, value=x, attn_mask=attn_mask, need_weights=False)[0]

    def _cross(self, x, memory, query_pos, pos, memory_key_padding_mask):
        return self.cross_attn(
            _with_pos(x, query_pos),
            _with_pos(memory, pos),
            value=memory,
            key_padding_mask=memory_key_padding_mask,
            need_weights=False,
        )[0]

    def _ffn(self, x):
        return self.linear2(self.dropout(self.activation(self.linear1(x))))

    def forward(
        self,
        tgt: torch.Tensor,
        memory: torch.Tensor,
        *,
        pos: Optional[torch.Tensor] = None,
        query_pos: Optional[torch.Tensor] = None,
        memory_key_padding_mask: Optional[torch.Tensor] = None,
        query_attn_mask: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """tgt, query_pos: [B, Q, D]; memory, pos: [B, HW, D]; memory_key_padding_mask: bool
        [B, HW], True on padding; query_attn_mask: bool [Q, Q], True where query i may not
        attend to query j."""
        if self.normalize_before:
            tgt = tgt + self.dropout1(self._self(self.norm1(tgt), query_pos, query_attn_mask))
            tgt = tgt + self.dropout2(self._cross(self.norm2(tgt), memory, query_pos, pos, memory_key_padding_mask))
            return tgt + self.dropout3(self._ffn(self.norm3(tgt)))
        tgt = self.norm1(tgt + self.dropout1(self._self(tgt, query_pos, query_attn_mask)))
        tgt = self.norm2(tgt + self.dropout2(self._cross(tgt, memory, query_pos, pos, memory_key_padding_mask)))
        return self.norm3(tgt + self.dropout3(self._ffn(tgt)))


class TransformerEncoder(nn.Module):
    def __init__(self, layer: TransformerEncoderLayer, num_layers: int, norm: Optional[nn.Module] = None):
        super().__init__()
        self.layers = nn.ModuleList([copy.deepcopy(layer) for _ in range(num_layers)])
        self.norm = norm

    def forward(self, src, *, pos=None, key_padding_mask=None):
        for layer in self.layers:
            src = layer(src, pos=pos, key_padding_mask=key_padding_mask)
        return src if self.norm is None else self.norm(src)


class TransformerDecoder(nn.Module):
    """Returns the (normalized) output of every layer, stacked: [num_layers, B, Q, D]; the
    intermediate outputs feed the auxiliary decoding losses."""

    def __init__(self, layer: TransformerDecoderLayer, num_layers: int, norm: nn.Module):
        super().__init__()
        self.layers = nn.ModuleList([copy.deepcopy(layer) for _ in range(num_layers)])
        self.norm = norm

    def forward(self, tgt, memory, *, pos=None, query_pos=None, memory_key_padding_mask=None, query_attn_mask=None):
        outputs = []
        for layer in self.layers:
            tgt = layer(
                tgt,
                memory,
                pos=pos,
                query_pos=query_pos,
                memory_key_padding_mask=memory_key_padding_mask,
                query_attn_mask=query_attn_mask,
            )
            outputs.append(self.norm(tgt))
        return torch.stack(outputs)


class Transformer(nn.Module):
    """DETR encoder-decoder.

    Args:
        d_model: hidden width D.
        nhead: attention heads (D must be divisible by it).
        num_encoder_layers, num_decoder_layers: depths (the encoder may have 0 layers).
        dim_feedforward: FFN hidden width.
        dropout: dropout inside attention and FFN.
        activation: "relu" or "gelu".
        normalize_before: pre-norm layers (DETR's default is post-norm).
    """

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
        if d_model % nhead:
            raise ValueError(f"d_model ({d_model}) must be divisible by nhead ({nhead})")
        if num_decoder_layers < 1 or num_encoder_layers < 0:
            raise ValueError(
                f"need num_decoder_layers >= 1 and num_encoder_layers >= 0, got "
                f"{num_decoder_layers} and {num_encoder_layers}"
            )
        enc_layer = TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation, normalize_before)
        self.encoder = TransformerEncoder(
            enc_layer, num_encoder_layers, nn.LayerNorm(d_model) if normalize_before else None
        )
        dec_layer = TransformerDecoderLayer(d_model, nhead, dim_feedforward, dropout, activation, normalize_before)
        self.decoder = TransformerDecoder(dec_layer, num_decoder_layers, nn.LayerNorm(d_model))
        self.d_model = d_model
        self.nhead = nhead
        self._reset_parameters()

    def _reset_parameters(self):
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
            src: [B, D, H, W] projected features; mask: bool [B, H, W], True on padding;
            query_embed: [Q, D] learned object queries; pos: [B, D, H, W] positional encoding;
            query_attn_mask: optional bool [Q, Q] for the decoder self-attention, True where
                query i may not attend to query j.
        Returns:
            hs: [num_decoder_layers, B, Q, D] decoder outputs;
            memory: [B, D, H, W] encoder output.
        """
        b, d, h, w = src.shape
        src_seq = src.flatten(2).transpose(1, 2)
        pos_seq = pos.flatten(2).transpose(1, 2)
        mask_seq = mask.flatten(1)
        query_pos = query_embed.unsqueeze(0).expand(b, -1, -1)
        # Decoder input starts at zero: the object queries enter only as positional encodings.
        tgt = torch.zeros_like(query_pos)
        memory = self.encoder(src_seq, pos=pos_seq, key_padding_mask=mask_seq)
        hs = self.decoder(
            tgt,
            memory,
            pos=pos_seq,
            query_pos=query_pos,
            memory_key_padding_mask=mask_seq,
            query_attn_mask=query_attn_mask,
        )
        return hs, memory.transpose(1, 2).reshape(b, d, h, w)
