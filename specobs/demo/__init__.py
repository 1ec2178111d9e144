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
``"slow-verify"``, ``"stall"``, ``"sync-between-phases"`` or ``None``.

The default models (d_model 128, 6 layers, k=4, seed 7) ship with specobs in
``specobs/demo/weights/``, so every machine serves the same draft: freshly trained drafts differ
from machine to machine and seed to seed in how far ``wrong-hidden-layers`` collapses their
acceptance. Another seed or recipe trains on its first run and is cached afterwards; ``specobs
demo`` then serves as soon as the target is trained and trains the draft head in the background
(``build_engine(..., draft_in_background=True)``). The acceptance rates, training times and
cycle rates measured on CPU and GPU are in benchmarks/RESULTS.md ("The shipped demo models",
"The demo engine on CPU").

Importing :mod:`specobs` never imports this package (it needs torch).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

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

# Everything here needs torch, so nothing is imported until it is asked for: the server module
# lives in this package and must import without paying for torch (its tests give it stand-ins).
_WHERE = {
    "FAULTS": "._engine", "EngineStats": "._request", "RequestHandle": "._request",
    "SpecDecodeEngine": "._engine", "DraftConfig": "._draft", "DraftHead": "._draft",
    "KVCache": "._model", "TargetConfig": "._model", "TargetModel": "._model",
    "WordTokenizer": "._model", "greedy_generate": "._model", "TrainSettings": "._recipe",
    "TrainedModels": "._train", "resolve_cache_dir": "._train", "build_engine": "._factory",
    "load_models": "._factory",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'specobs.demo' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value
