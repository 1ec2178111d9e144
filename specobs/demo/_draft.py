"""EAGLE-3-style draft head for the demo target.

The head reads the target's hidden states from three layers (low, middle, high), fuses them with
one linear layer (3d -> d), combines the result with the embedding of the next token (a linear
layer over ``[fused; embedding]``, 2d -> d), runs one decoder layer with its own KV cache, and
predicts with the TARGET's frozen LM head (after the head's own final norm). For the
second and later tokens of a chain there are no target hidden states yet, so, as in EAGLE-3, the
draft's own output hidden state takes the place of the fused target feature.

Position bookkeeping (the same in training and at inference): the draft input at position ``t`` is
``(g_t, x_{t+1})`` where ``g_t`` is the fused target feature after reading ``x_0..x_t``; its output
predicts ``x_{t+2}``. The draft KV cache is indexed by the same positions as the target's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

import torch
import torch.nn.functional as F
from torch import nn

from ._model import (
    AttentionStep,
    Block,
    KVCache,
    RMSNorm,
    TargetConfig,
    TargetModel,
    apply_rope,
    causal_mask,
)

__all__ = ["DraftConfig", "DraftHead", "default_layer_ids"]


def default_layer_ids(n_layers: int) -> tuple[int, int, int]:
    """Low, middle and high target layers the draft reads: ``(1, n // 2, n - 2)``."""
    return (min(1, n_layers - 1), n_layers // 2, max(0, n_layers - 2))


@dataclasses.dataclass(frozen=True)
class DraftConfig:
    """The draft head's shape and which target layers feed it (block outputs, 0-based)."""

    layer_ids: tuple[int, int, int]
    d_ff: int = 256

    @classmethod
    def for_target(cls, target: TargetConfig, **overrides: object) -> DraftConfig:
        values: dict[str, object] = {"layer_ids": default_layer_ids(target.n_layers)}
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    def validate(self, target: TargetConfig) -> None:
        ids = self.layer_ids
        if len(ids) != 3 or not all(isinstance(i, int) and 0 <= i < target.n_layers for i in ids):
            raise ValueError(
                f"DraftConfig.layer_ids must be 3 target block indices in [0, "
                f"{target.n_layers}), got {ids!r}"
            )

    def digest(self) -> str:
        blob = json.dumps(dataclasses.asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


class DraftHead(nn.Module):
    """One-layer EAGLE-3 draft head. ``target`` supplies the (frozen, shared) embedding, rotary
    table and LM head; they are not part of this module's parameters or state dict."""

    def __init__(self, config: DraftConfig, target: TargetModel) -> None:
        super().__init__()
        config.validate(target.config)
        self.config = config
        c = target.config
        d = c.d_model
        self.fuse = nn.Linear(3 * d, d, bias=False)
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.block = Block(d, c.n_heads, config.d_ff)
        self.norm = RMSNorm(d)
        # A plain list keeps the target out of this module's parameters and state dict.
        self._target = [target]
        for p in target.parameters():
            p.requires_grad_(False)
        for module in (
            self.fuse,
            self.fc,
            self.block.up,
            self.block.down,
            self.block.attn.qkv,
            self.block.attn.out,
        ):
            nn.init.normal_(module.weight, std=0.02)

    @property
    def target(self) -> TargetModel:
        return self._target[0]

    def new_cache(self, n_slots: int, *, device: torch.device | str | None = None) -> KVCache:
        c = self.target.config
        dev = device if device is not None else self.fc.weight.device
        return KVCache(1, n_slots, c.n_heads, c.max_seq_len, c.head_dim, device=dev)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.lm_head(self.norm(hidden))

    def inputs(
        self,
        feature: torch.Tensor,
        tokens: torch.Tensor,
        fused: bool,
        token_keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``fc([g; emb(x)])``: ``feature`` is the target's 3-layer hidden (``fused=True``, 3d) or
        the draft's own previous output (d). ``token_keep`` (training only) zeroes some token
        embeddings."""
        g = self.fuse(feature) if fused else feature
        emb = self.target.embed(tokens)
        if token_keep is not None:
            emb = emb * token_keep.unsqueeze(-1)
        return self.fc(torch.cat((g, emb), dim=-1))

    def forward(
        self,
        feature: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        *,
        fused: bool,
        cache: KVCache,
        slots: torch.Tensor,
        attend_len: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step over ``[B, Q]`` positions with the draft KV cache; returns the output
        hidden ``[B, Q, d]`` and logits ``[B, Q, V]``."""
        if attend_len is None:
            attend_len = int(positions.max()) + 1
        x = self.inputs(feature, tokens, fused)
        step = AttentionStep(
            self.target.rope(positions), causal_mask(positions, attend_len), slots, positions,
            attend_len,
        )
        h = self.block(x, step, (cache.k[0], cache.v[0]))
        return h, self.logits(h)

    def train_forward(
        self,
        features: torch.Tensor,
        tokens: torch.Tensor,
        n_steps: int,
        token_keep: torch.Tensor | None = None,
    ) -> list[torch.Tensor]:
        """Training-time unrolling of ``n_steps`` chain steps over whole sequences (no cache).

        ``features`` ``[B, T, 3d]`` are the target's hidden states at positions ``0..T-1`` and
        ``tokens`` ``[B, T]`` the NEXT tokens ``x_{t+1}``. Returns logits per step, ``[B, T, V]``
        each: entry ``t`` of step ``s`` (1-based) is what the draft would predict for ``x_{t+2}``
        at chain step ``s`` when the last verified position was ``t - s + 1``. At inference that
        query sees the draft keys of positions ``<= t - s + 1`` (made from target features) and
        the keys of chain steps ``2..s`` at positions ``t - s + 2 .. t``; the attention below
        reproduces exactly that. Entries with ``t < s - 1`` are meaningless. ``token_keep``
        ``[B, T]`` zeroes the step-1 token embeddings where 0 (token dropout, so that the head
        learns to read the target's features rather than only n-gram statistics of tokens).
        """
        b, t_len, _ = features.shape
        blk = self.block
        attn = blk.attn
        h_heads, hd = attn.n_heads, attn.head_dim
        positions = torch.arange(t_len, device=features.device).expand(b, t_len)
        rope = self.target.rope(positions)
        idx = torch.arange(t_len, device=features.device)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        outputs: list[torch.Tensor] = []
        prev: torch.Tensor | None = None
        for step in range(1, n_steps + 1):
            if step == 1:
                x = self.inputs(features, tokens, fused=True, token_keep=token_keep)
            else:
                assert prev is not None
                # Step s at position t continues from step s-1's output at position t-1.
                shifted = torch.cat((torch.zeros_like(prev[:, :1]), prev[:, :-1]), dim=1)
                x = self.inputs(shifted, tokens, fused=False)
            a_in = blk.attn_norm(x)
            q, k, v = attn.qkv(a_in).view(b, t_len, 3, h_heads, hd).unbind(2)
            q, k = apply_rope(q, rope), apply_rope(k, rope)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, T, D]
            keys.append(k)
            values.append(v)
            scale = hd**-0.5
            # Step-1 keys, visible up to position t - s + 1.
            s1 = (q @ keys[0].transpose(-1, -2)) * scale  # [B, H, T, T]
            visible = idx.view(1, -1) <= (idx.view(-1, 1) - step + 1)
            s1 = s1.masked_fill(~visible, float("-inf"))
            # Keys of chain steps j = 2..s sit at position t - s + j, i.e. shifted by s - j.
            diag_scores = []
            diag_values = []
            for j in range(2, step + 1):
                shift = step - j
                kj = _shift(keys[j - 1], shift)
                diag_scores.append((q * kj).sum(-1, keepdim=True) * scale)
                diag_values.append(_shift(values[j - 1], shift))
            scores = torch.cat([s1, *diag_scores], dim=-1)
            # Rows with nothing visible (t < s - 1) would be all -inf; give them a dummy 0.
            scores = torch.nan_to_num(scores.softmax(-1), nan=0.0)
            y = scores[..., :t_len] @ values[0]
            for j, dv in enumerate(diag_values):
                y = y + scores[..., t_len + j : t_len + j + 1] * dv
            y = y.transpose(1, 2).reshape(b, t_len, -1)
            h = x + attn.out(y)
            h = h + blk.down(F.silu(blk.up(blk.mlp_norm(h))))
            outputs.append(self.logits(h))
            prev = h
        return outputs


def _shift(x: torch.Tensor, shift: int) -> torch.Tensor:
    """Entry ``t`` of the result is entry ``t - shift`` of ``x`` along dim 2 (zeros before 0)."""
    if shift == 0:
        return x
    pad = torch.zeros_like(x[:, :, :shift])
    return torch.cat((pad, x[:, :, :-shift]), dim=2)
