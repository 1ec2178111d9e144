"""A real EAGLE-3-style speculative decoding engine in torch, small enough for a laptop CPU.

Nothing here is simulated: a decoder-only target transformer (:mod:`._model`) is trained at
start-up on a seeded synthetic language, an EAGLE-3-style draft head (:mod:`._draft`) that reads
three of the target's hidden layers is trained on the target's own greedy continuations
(:mod:`._train`), and :class:`SpecDecodeEngine` (:mod:`._engine`) serves concurrent requests by
batched draft-k / verify-once / accept-longest-prefix cycles, token-for-token identical to plain
greedy decoding of the target. The weights are cached under ``$SPECOBS_CACHE_DIR``,
``$XDG_CACHE_HOME/specobs`` or ``~/.cache/specobs``, keyed by a hash of the configs.

Usage::

    from specobs.demo import build_engine
    engine = build_engine(observer=specobs.configure(...))
    engine.start()
    handle = engine.submit(engine.tokenizer.encode("to mouro"), max_tokens=64)
    print(engine.tokenizer.decode(handle.wait()))

Faults for alert testing are switched at run time: ``engine.fault = "wrong-hidden-layers"``,
``"slow-verify"``, ``"stall"`` or ``None``.

Measured (default config: d_model 128, 6 layers, k=4, seed 0):

- acceptance rate (accepted / drafted tokens): 0.57-0.73 with the healthy draft, 0.19-0.27 with
  ``wrong-hidden-layers`` (the draft fed layers (5, 4, 0) instead of (1, 3, 4));
- 2 idle CPU cores: start-up training 41-45 s (cached afterwards: loading takes < 1 s); about
  200 speculative cycles/s at batch 4 (well above the 30 cycles/s the demo needs);
- H200 with CUDA graphs: about 590 cycles/s at batch 4 (launch-bound at this model size).

Importing :mod:`specobs` never imports this package (it needs torch).
"""

from __future__ import annotations

import os
from typing import Any

from ._draft import DraftConfig, DraftHead
from ._engine import FAULTS, EngineStats, RequestHandle, SpecDecodeEngine
from ._model import KVCache, TargetConfig, TargetModel, WordTokenizer, greedy_generate
from ._train import TrainedModels, TrainSettings, load_or_train, resolve_cache_dir

__all__ = [
    "FAULTS",
    "DraftConfig",
    "DraftHead",
    "EngineStats",
    "KVCache",
    "RequestHandle",
    "SpecDecodeEngine",
    "TargetConfig",
    "TargetModel",
    "TrainSettings",
    "TrainedModels",
    "WordTokenizer",
    "build_engine",
    "greedy_generate",
    "load_models",
    "resolve_cache_dir",
]

_TARGET_FIELDS = {
    "vocab_size",
    "d_model",
    "n_layers",
    "n_heads",
    "d_ff",
    "max_seq_len",
    "rope_theta",
}


def load_models(
    *,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
    layer_ids: tuple[int, int, int] | None = None,
    draft_d_ff: int | None = None,
    train_settings: TrainSettings | None = None,
    **model_overrides: Any,
) -> TrainedModels:
    """Load the demo's target and draft from the weight cache, or train and cache them.

    ``model_overrides`` are :class:`TargetConfig` fields (``d_model=...``, ``n_layers=...``)."""
    unknown = set(model_overrides) - _TARGET_FIELDS
    if unknown:
        raise ValueError(
            f"unknown model override(s) {sorted(unknown)}: expected TargetConfig fields "
            f"{sorted(_TARGET_FIELDS)}"
        )
    target_config = TargetConfig(**model_overrides)
    draft_kwargs: dict[str, Any] = {}
    if layer_ids is not None:
        draft_kwargs["layer_ids"] = tuple(layer_ids)
    if draft_d_ff is not None:
        draft_kwargs["d_ff"] = draft_d_ff
    draft_config = DraftConfig.for_target(target_config, **draft_kwargs)
    return load_or_train(
        target_config, draft_config, seed=seed, cache_dir=cache_dir, settings=train_settings
    )


def build_engine(
    *,
    device: str = "cpu",
    k: int = 4,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
    observer: Any = None,
    max_batch: int = 8,
    fault: str | None = None,
    cuda_graphs: bool | None = None,
    train_settings: TrainSettings | None = None,
    layer_ids: tuple[int, int, int] | None = None,
    **model_overrides: Any,
) -> SpecDecodeEngine:
    """A ready :class:`SpecDecodeEngine` over cached (or freshly trained) demo models.

    ``engine.models`` keeps the :class:`TrainedModels` (training info, whether it came from the
    cache)."""
    models = load_models(
        seed=seed,
        cache_dir=cache_dir,
        layer_ids=layer_ids,
        train_settings=train_settings,
        **model_overrides,
    )
    engine = SpecDecodeEngine(
        models.target,
        models.draft,
        models.language.tokenizer,
        k=k,
        max_batch=max_batch,
        device=device,
        observer=observer,
        fault=fault,
        cuda_graphs=cuda_graphs,
    )
    engine.models = models
    return engine
