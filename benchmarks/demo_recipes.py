"""How the demo's training recipe trades start-up time against the draft's quality and against
how hard acceptance collapses under the ``wrong-hidden-layers`` fault, across seeds.

Each job trains a target and a draft head from scratch on CPU (timed), then measures the acceptance
rate (k=4, greedy, 64 tokens per prompt, ``SyntheticLanguage.held_out_prompts``) with the healthy
layers and with several wrong layer sets, and the "logit lens" of every target layer (how often the
layer's hidden state, read through the final norm and LM head, already names the target's next
greedy token). Jobs run in parallel processes with ``--threads`` torch threads each.

    python benchmarks/demo_recipes.py --jobs 8 --threads 2 --seeds 0 1 2 3 \\
        --recipe base '{}' --recipe fast '{"target_steps": 180, "draft_steps": 160}'

A recipe is a JSON object of ``TrainSettings`` fields, plus ``"zipf"`` (the synthetic language's
skew, ``SyntheticLanguage.ZIPF``) and ``"model"`` (``TargetConfig`` fields, e.g.
``{"residual_growth": 0}``). One JSON line per job on stdout.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import sys
import time
from typing import Any

WRONG_SETS = {
    "top-down": (5, 4, 0),
    "reversed": (4, 3, 1),
    "bottom": (0, 0, 0),
    "low": (2, 1, 0),
    "first3": (0, 1, 2),
    "last3": (5, 5, 5),
    "last-first": (5, 5, 0),
    "first-last": (0, 5, 5),
    "top-top-mid": (5, 5, 4),
    "last-bottom": (5, 0, 0),
}


_DEFAULT_ZIPF: dict[str, float] = {}


def _acceptance(engine: Any, prompts: list[list[int]], max_tokens: int = 64) -> float:
    before = engine.stats()
    for p in prompts:
        engine.submit(p, max_tokens)
    while engine.has_work():
        engine.step()
    after = engine.stats()
    return (after.accepted_tokens - before.accepted_tokens) / (
        after.draft_tokens - before.draft_tokens
    )


def job(name: str, recipe: dict[str, Any], seed: int, threads: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    from specobs.demo._draft import DraftConfig
    from specobs.demo._engine import SpecDecodeEngine
    from specobs.demo._model import SyntheticLanguage, TargetConfig
    from specobs.demo._train import TrainSettings, distill_data, train_draft, train_target

    recipe = dict(recipe)
    model = recipe.pop("model", {})
    # Worker processes are reused: restore the language's own skew unless the recipe sets one.
    _DEFAULT_ZIPF.setdefault("zipf", SyntheticLanguage.ZIPF)
    SyntheticLanguage.ZIPF = float(recipe.pop("zipf", _DEFAULT_ZIPF["zipf"]))
    settings = TrainSettings(**recipe)
    cfg = TargetConfig(**model)
    language = SyntheticLanguage(cfg.vocab_size, seed=seed)
    dcfg = DraftConfig.for_target(cfg)
    t0 = time.perf_counter()
    target, info = train_target(cfg, language, seed, settings)
    t1 = time.perf_counter()
    data = distill_data(target, language, dcfg.layer_ids, seed, settings)
    t2 = time.perf_counter()
    draft, _ = train_draft(target, dcfg, data, seed, settings)
    t3 = time.perf_counter()
    with torch.inference_mode():
        seqs = data[0][:32]
        _, hidden = target(seqs, hidden_layers=tuple(range(cfg.n_layers)))
        layers = hidden.view(*hidden.shape[:2], cfg.n_layers, cfg.d_model)
        lens = [
            round(
                float(
                    (target.lm_head(target.norm(layers[:, :-1, i])).argmax(-1) == seqs[:, 1:])
                    .float()
                    .mean()
                ),
                2,
            )
            for i in range(cfg.n_layers)
        ]
        unit = torch.nn.functional.normalize(layers, dim=-1)
        cos = torch.einsum("btid,btjd->ij", unit, unit) / (unit.shape[0] * unit.shape[1])
        norms = [round(float(x), 1) for x in layers.norm(dim=-1).mean((0, 1))]
    engine = SpecDecodeEngine(target, draft, language.tokenizer, k=4, max_batch=8)
    prompts = language.held_out_prompts()
    out: dict[str, Any] = {
        "recipe": name,
        "seed": seed,
        "threads": threads,
        "target_s": round(t1 - t0, 1),
        "distill_s": round(t2 - t1, 1),
        "draft_s": round(t3 - t2, 1),
        "train_s": round(t3 - t0, 1),
        "target_loss": round(info["target_loss"], 3),
        "logit_lens": lens,
        "layer_norms": norms,
        "cos_1_5": round(float(cos[1, 5]), 2),
        "cos_0_4": round(float(cos[0, 4]), 2),
        "healthy": round(_acceptance(engine, prompts[4:24]), 3),
        "healthy_test": round(_acceptance(engine, prompts[4:12]), 3),
    }
    for label, layer_ids in WRONG_SETS.items():
        engine.wrong_layer_ids = layer_ids
        engine.fault = "wrong-hidden-layers"
        out[f"wrong_{label}"] = round(_acceptance(engine, prompts[4:24]), 3)
        out[f"wrong_{label}_test"] = round(_acceptance(engine, prompts[4:12]), 3)
        engine.fault = None
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--recipe", nargs=2, action="append", metavar=("NAME", "JSON"), required=True
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    work = [(name, json.loads(raw), seed) for name, raw in args.recipe for seed in args.seeds]
    with cf.ProcessPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(job, n, r, s, args.threads): (n, s) for n, r, s in work}
        for fut in cf.as_completed(futures):
            try:
                print(json.dumps(fut.result()), flush=True)
            except Exception as exc:
                name, seed = futures[fut]
                print(json.dumps({"recipe": name, "seed": seed, "error": repr(exc)}), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
