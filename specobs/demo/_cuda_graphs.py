"""CUDA graphs of the engine's device work: the draft chain and the verify forward, per batch
bucket.

A captured graph replays the kernels it recorded on the tensors it recorded, so every input lives
in a static tensor that :meth:`StepGraph.load` fills before each replay. A batch runs in the
smallest bucket (1, 2, 4, ... up to ``max_batch``) that holds it; the rows past the batch use the
engine's scratch slot, so their KV writes touch no live sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ._forwards import SpecForwards
from ._model import serving_matmuls

__all__ = ["EngineGraphs", "StepGraph", "batch_buckets", "capture_cuda_graph"]


def capture_cuda_graph(run: Callable[[], Any], device: Any) -> tuple[Any, Any]:
    """``run`` warmed up on a side stream, then captured: ``(graph, outputs)``.

    Replaying the graph recomputes ``outputs`` in place from the tensors ``run`` read.
    """
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side), torch.inference_mode(), serving_matmuls(device):
        for _ in range(2):
            run()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.inference_mode(), serving_matmuls(device):
        out = run()
    torch.cuda.current_stream(device).synchronize()
    return graph, out


def batch_buckets(max_batch: int) -> list[int]:
    """The batch sizes a graph is captured for: powers of two below ``max_batch``, then it."""
    out, b = [], 1
    while b < max_batch:
        out.append(b)
        b *= 2
    return [*out, max_batch]


class EngineGraphs:
    """The engine's captured draft chains and verify forwards (healthy and mis-wired layers),
    one of each per batch bucket."""

    def __init__(
        self, fw: SpecForwards, max_batch: int, layer_ids: tuple[int, ...],
        wrong_layer_ids: tuple[int, ...],
    ) -> None:
        self._buckets = batch_buckets(max_batch)
        self._wrong = wrong_layer_ids
        self._graphs: dict[tuple[str, int, bool], StepGraph] = {}
        for b in self._buckets:
            self._graphs[("draft", b, False)] = StepGraph(fw, "draft", b, layer_ids)
            for layers in (layer_ids, wrong_layer_ids):
                self._graphs[("verify", b, layers == wrong_layer_ids)] = StepGraph(
                    fw, "verify", b, layers
                )

    def _bucket(self, b: int) -> int:
        return next(x for x in self._buckets if x >= b)

    def draft(self, slots_h: torch.Tensor, start_h: torch.Tensor) -> torch.Tensor:
        """The draft chain's tokens ``[B, k]``, replayed."""
        b = slots_h.shape[0]
        g = self._graphs[("draft", self._bucket(b), False)]
        g.load(slots_h, start_h)
        g.graph.replay()
        return g.out[0][:b]

    def verify(
        self, slots_h: torch.Tensor, tlen_h: torch.Tensor, draft_tokens: torch.Tensor,
        layers: tuple[int, ...],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The verify forward's predictions and hidden states, replayed."""
        b = slots_h.shape[0]
        g = self._graphs[("verify", self._bucket(b), layers == self._wrong)]
        g.load(slots_h, tlen_h, draft_tokens)
        g.graph.replay()
        return g.out[0][:b], g.out[1][:b]


class StepGraph:
    """One captured draft chain or verify forward for a fixed batch bucket, with static inputs.
    Padding rows use the scratch slot, so their KV writes touch no live sequence."""

    def __init__(
        self, fw: SpecForwards, kind: str, bucket: int, layers: tuple[int, ...]
    ) -> None:
        dev = fw.device
        self.kind = kind
        self.bucket = bucket
        self.scratch = fw.scratch
        self.slots = torch.full((bucket,), fw.scratch, dtype=torch.long, device=dev)
        self.start = torch.zeros(bucket, dtype=torch.long, device=dev)
        self.drafts = torch.zeros(bucket, fw.k, dtype=torch.long, device=dev)
        max_len = fw.config.max_seq_len
        k = fw.k

        def run() -> tuple[torch.Tensor, ...]:
            if kind == "draft":
                return (
                    fw.draft_chain(
                        self.slots,
                        self.start,
                        attend_len=max_len,
                        q_len=k + 1,
                        slots=self.slots,
                        start=self.start,
                    ),
                )
            return fw.verify(
                self.slots,
                self.start,
                self.drafts,
                layers,
                attend_len=max_len,
                slots=self.slots,
                tlen=self.start,
            )

        self.graph, self.out = capture_cuda_graph(run, dev)

    def load(
        self, slots_h: torch.Tensor, start_h: torch.Tensor, drafts: torch.Tensor | None = None
    ) -> None:
        b = slots_h.shape[0]
        self.slots[:b].copy_(slots_h, non_blocking=True)
        self.slots[b:].fill_(self.scratch)
        self.start[:b].copy_(start_h, non_blocking=True)
        self.start[b:].zero_()
        if drafts is not None:
            self.drafts[:b].copy_(drafts)
            self.drafts[b:].zero_()
