"""The engine's device state and the tensor work of a speculative cycle.

:class:`SpecForwards` owns the two KV caches and, per slot, what the draft has not consumed yet:
the target features and tokens of the positions verified last cycle (``pend_*``). It runs the
prefill, the draft chain and the verify forward; the engine decides when and for which slots,
and keeps the requests and the counters. The same code runs eagerly and under CUDA graph capture
(:mod:`._cuda_graphs`), so nothing here copies to the host except the prefill's first tokens.
"""

from __future__ import annotations

import torch

from ._draft import DraftHead
from ._model import TargetModel

__all__ = ["SpecForwards"]


class SpecForwards:
    """The models, their KV caches and the pending features of every slot, on one device.

    Slot ``max_batch`` is scratch: padding rows of a CUDA-graph bucket write there.
    """

    def __init__(
        self, target: TargetModel, draft: DraftHead, *, k: int, max_batch: int,
        device: torch.device,
    ) -> None:
        self.target = target
        self.draft = draft
        self.config = target.config
        self.k = k
        self.device = device
        n_slots = max_batch + 1
        self.scratch = max_batch
        self.target_cache = target.new_cache(n_slots, device=device)
        self.draft_cache = draft.new_cache(n_slots, device=device)
        d3 = 3 * self.config.d_model
        self.pend_hidden = torch.zeros(n_slots, k + 1, d3, device=device)
        self.pend_tokens = torch.zeros(n_slots, k + 1, dtype=torch.long, device=device)
        self.pend_count = torch.ones(n_slots, dtype=torch.long, device=device)
        self._arange = torch.arange(k + 1, device=device)

    def set_lengths(self, slot: int, target_len: int, draft_start: int) -> None:
        """The KV "rollback": each cache keeps ``slot``'s entries below its new length."""
        self.target_cache.lengths[slot] = target_len
        self.draft_cache.lengths[slot] = draft_start

    def prefill(
        self, slots_list: list[int], prompts: list[tuple[int, ...]], layers: tuple[int, ...]
    ) -> list[int]:
        """Fill both caches with the prompts and return each one's first token (on the host)."""
        dev = self.device
        lens = [len(p) for p in prompts]
        p_max = max(lens)
        tokens = torch.zeros(len(prompts), p_max, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            tokens[i, : lens[i]] = torch.tensor(prompt)
        tokens = tokens.to(dev)
        slots = torch.tensor(slots_list, device=dev)
        positions = torch.arange(p_max, device=dev).expand(len(prompts), p_max)
        logits, hidden = self.target(
            tokens, positions, cache=self.target_cache, slots=slots, hidden_layers=layers
        )
        assert hidden is not None
        last = torch.tensor(lens, device=dev) - 1
        rows = torch.arange(len(prompts), device=dev)
        first = logits[rows, last].argmax(-1)
        if p_max > 1:
            # Draft prefill over positions 0..P-2: inputs (g_t, x_{t+1}). Position P-1 stays
            # pending so the first cycle's draft step consumes it like any other.
            self.draft(
                hidden[:, :-1], tokens[:, 1:], positions[:, :-1], fused=True,
                cache=self.draft_cache, slots=slots,
            )
        self.pend_hidden[slots, 0] = hidden[rows, last]
        self.pend_tokens[slots, 0] = first
        self.pend_count[slots] = 1
        first_host: list[int] = first.tolist()
        return first_host

    def keep_pending(
        self, slots_h: torch.Tensor, hidden: torch.Tensor, preds: torch.Tensor,
        accepted: torch.Tensor,
    ) -> None:
        """After a verify: its features and tokens wait for the next cycle's draft, the accepted
        prefix plus the bonus token of each slot."""
        slots_d = slots_h.to(self.device)
        self.pend_hidden[slots_d] = hidden
        self.pend_tokens[slots_d] = preds
        self.pend_count[slots_d] = accepted + 1

    def last_tokens(self, active: list[int]) -> torch.Tensor:
        """Each active slot's pending token ``[B]``, the next input of a plain decode step."""
        return self.pend_tokens[torch.tensor(active, device=self.device), 0]

    def draft_chain(
        self,
        slots_h: torch.Tensor,
        start_h: torch.Tensor,
        *,
        attend_len: int,
        q_len: int,
        slots: torch.Tensor | None = None,
        start: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The draft's ``k`` tokens ``[B, k]``: one fused step over the pending positions, then
        ``k - 1`` chained steps on its own hidden state. ``slots`` / ``start`` on the device,
        when given, replace the host tensors (a CUDA graph's static inputs)."""
        dev = self.device
        if slots is None or start is None:
            slots, start = slots_h.to(dev), start_h.to(dev)
        max_pos = self.config.max_seq_len - 1
        count = self.pend_count[slots]
        b = slots.shape[0]
        rows = torch.arange(b, device=dev)
        positions = (start.unsqueeze(1) + self._arange[:q_len]).clamp(max=max_pos)
        feats = self.pend_hidden[slots, :q_len]
        toks = self.pend_tokens[slots, :q_len]
        h, logits = self.draft(
            feats,
            toks,
            positions,
            fused=True,
            cache=self.draft_cache,
            slots=slots,
            attend_len=attend_len,
        )
        last = count - 1
        h = h[rows, last].unsqueeze(1)
        tok = logits[rows, last].argmax(-1)
        out = [tok]
        pos = start + count
        for _ in range(self.k - 1):
            h, logits = self.draft(
                h,
                tok.unsqueeze(1),
                pos.clamp(max=max_pos).unsqueeze(1),
                fused=False,
                cache=self.draft_cache,
                slots=slots,
                attend_len=attend_len,
            )
            tok = logits[:, 0].argmax(-1)
            out.append(tok)
            pos = pos + 1
        return torch.stack(out, dim=1)

    def verify(
        self,
        slots_h: torch.Tensor,
        tlen_h: torch.Tensor,
        draft_tokens: torch.Tensor,
        layers: tuple[int, ...],
        *,
        attend_len: int,
        slots: torch.Tensor | None = None,
        tlen: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ONE target forward over ``[pending token, d_1 .. d_k]`` per slot: the target's
        greedy predictions ``[B, k + 1]`` and the fused hidden features of those positions."""
        dev = self.device
        if slots is None or tlen is None:
            slots, tlen = slots_h.to(dev), tlen_h.to(dev)
        pending = self.pend_tokens[slots, self.pend_count[slots] - 1]
        tokens = torch.cat((pending.unsqueeze(1), draft_tokens), dim=1)
        positions = (tlen.unsqueeze(1) + self._arange).clamp(max=self.config.max_seq_len - 1)
        logits, hidden = self.target(
            tokens,
            positions,
            cache=self.target_cache,
            slots=slots,
            attend_len=attend_len,
            hidden_layers=layers,
        )
        assert hidden is not None
        return logits.argmax(-1), hidden
