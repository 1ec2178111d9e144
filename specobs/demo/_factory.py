"""Building the demo engine: load cached weights or train them, then wrap them in an engine."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ._draft import DraftConfig
from ._engine import SpecDecodeEngine
from ._model import TargetConfig
from ._train import DEFAULT_SEED, TrainedModels, TrainSettings, load_or_train

__all__ = ["build_engine", "load_models"]

_TARGET_FIELDS = {f.name for f in dataclasses.fields(TargetConfig)}


def load_models(
    *,
    seed: int = DEFAULT_SEED,
    cache_dir: str | os.PathLike[str] | None = None,
    layer_ids: tuple[int, int, int] | None = None,
    draft_d_ff: int | None = None,
    train_settings: TrainSettings | None = None,
    draft_in_background: bool = False,
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
    return load_or_train(target_config, draft_config, seed=seed, cache_dir=cache_dir,
                         settings=train_settings, draft_in_background=draft_in_background)


def build_engine(
    *,
    device: str = "cpu",
    k: int = 4,
    seed: int = DEFAULT_SEED,
    cache_dir: str | os.PathLike[str] | None = None,
    observer: Any = None,
    max_batch: int = 8,
    fault: str | None = None,
    cuda_graphs: bool | None = None,
    train_settings: TrainSettings | None = None,
    layer_ids: tuple[int, int, int] | None = None,
    draft_in_background: bool = False,
    **model_overrides: Any,
) -> SpecDecodeEngine:
    """A ready :class:`SpecDecodeEngine` over cached (or freshly trained) demo models.

    ``engine.models`` keeps the :class:`TrainedModels` (training info, whether it came from the
    cache).

    ``draft_in_background=True``: on a cold cache only the target is trained here, and the
    engine starts with an untrained draft head; start its training with
    ``engine.models.pending.start(engine.load_draft_state)`` (see ``BackgroundDraft``)."""
    models = load_models(seed=seed, cache_dir=cache_dir, layer_ids=layer_ids,
                         train_settings=train_settings, draft_in_background=draft_in_background,
                         **model_overrides)
    engine = SpecDecodeEngine(models.target, models.draft, models.language.tokenizer, k=k,
                              max_batch=max_batch, device=device, observer=observer, fault=fault,
                              cuda_graphs=cuda_graphs)
    engine.models = models
    return engine
