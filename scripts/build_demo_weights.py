#!/usr/bin/env python3
"""Rebuild the demo models that ship with specobs (specobs/demo/weights/).

Trains the default recipe (default TargetConfig, DraftConfig and TrainSettings, seed
specobs.demo._train.DEFAULT_SEED) with one torch thread, measures the acceptance rate with the
healthy and the wrong-hidden-layers wiring on the held-out prompts the tests use, and writes the
file with the sha256 that belongs in ``SHIPPED_WEIGHTS``:

    python3 scripts/build_demo_weights.py OUT_DIR [--seed N]

The bits depend on the machine (CPU and torch build change floating-point sums), so the checksum
pins the shipped file, not the recipe; where the shipped file was built is in
benchmarks/RESULTS.md ("The shipped demo models"). Copy the file into specobs/demo/weights/ and
the digest into SHIPPED_WEIGHTS, replacing the old ones.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    import torch

    from specobs.demo import build_engine
    from specobs.demo._train import DEFAULT_SEED, SHIPPED_WEIGHTS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args()
    torch.set_num_threads(1)
    saved = dict(SHIPPED_WEIGHTS)
    SHIPPED_WEIGHTS.clear()  # train, even where a shipped file exists
    try:
        t0 = time.perf_counter()
        engine = build_engine(cache_dir=args.out_dir, seed=args.seed)
        seconds = time.perf_counter() - t0
    finally:
        SHIPPED_WEIGHTS.update(saved)
    prompts = engine.models.language.held_out_prompts()[4:12]

    def acceptance() -> float:
        before = engine.stats()
        for p in prompts:
            engine.submit(p, 64)
        while engine.has_work():
            engine.step()
        after = engine.stats()
        return (after.accepted_tokens - before.accepted_tokens) / (
            after.draft_tokens - before.draft_tokens
        )

    healthy = acceptance()
    engine.fault = "wrong-hidden-layers"
    wrong = acceptance()
    (path,) = args.out_dir.glob("demo-*.pt")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    print(f"seed {args.seed}: {'loaded' if engine.models.from_cache else 'trained'} in "
          f"{seconds:.0f} s; acceptance healthy {healthy:.3f}, wrong-hidden-layers {wrong:.3f}")
    print(f'{path}\n    "{path.stem[len("demo-"):]}": "{digest}",')
    return 0


if __name__ == "__main__":
    sys.exit(main())
