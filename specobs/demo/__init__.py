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

Measured (default config: d_model 128, 6 layers, k=4; the models that ship with specobs,
seed 7, ``specobs/demo/weights/``):

- acceptance rate (accepted / drafted tokens) on the held-out test prompts: 0.78 with the
  healthy draft, 0.17 with ``wrong-hidden-layers`` (the draft fed layers (5, 4, 0) instead of
  (1, 3, 4)), the same on the H200 host's CPU and on 2 vCPUs (the same weights everywhere).
  Freshly trained drafts differ from machine to machine and seed to seed: over 16 seeds the
  healthy rate was 0.40-0.77 and the fault kept 0.16-0.75 of it (median 0.51;
  ``benchmarks/demo_recipes.py``), which is why the default models ship instead of training
  on each machine. The target's residual updates grow with depth
  (``TargetConfig.residual_growth``), so its layers differ as in a large LLM's;
- the shipped models load in under a second; another seed or recipe trains on its first run
  (2 idle vCPUs: 75-80 s in all, target 41-50 s, distillation 4 s, draft head 33 s), cached
  afterwards. ``specobs demo`` serves as soon as the target
  is trained and trains the draft head in the background (``build_engine(...,
  draft_in_background=True)``), so its first cycle breakdown shows about 50 s after start;
  35-42 speculative cycles/s at batch 4 inside the demo (server and load share the 2 cores);
- H200 with CUDA graphs: 280-320 cycles/s at batch 4 (``benchmarks/demo_engine.py``;
  launch-bound at this model size).

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
    "FAULTS": "._engine", "EngineStats": "._engine", "RequestHandle": "._engine",
    "SpecDecodeEngine": "._engine", "DraftConfig": "._draft", "DraftHead": "._draft",
    "KVCache": "._model", "TargetConfig": "._model", "TargetModel": "._model",
    "WordTokenizer": "._model", "greedy_generate": "._model", "TrainSettings": "._train",
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
