"""Where the demo target's forward time goes as the block length q grows (q = k + 1 in verify):
the whole forward, under CUDA graphs as the engine replays it, for q = 1..9 at one batch, with
torch's choice of attention kernel and with the math one alone, and the qkv linear layer alone
at the same row counts. GPU clock (CUDA events over a stretch of replays).

    PYTHONPATH=. python3 benchmarks/diag/demo_forward_cost.py [--batch 4] [--reps 200]
        [--precision highest|high] [--blas cublas|cublaslt] [--profile]
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from specobs.demo import build_engine


def timed(fn: Callable[[], Any], reps: int) -> float:
    """Milliseconds per call of ``fn`` captured in a CUDA graph and replayed ``reps`` times.

    Captured here, not with the engine's ``capture_cuda_graph``, which captures in TF32
    (``serving_matmuls``): this script measures the precision ``--precision`` sets."""
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.inference_mode():
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.inference_mode():
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(10):
        graph.replay()
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--precision", default="highest",
                        help="torch.set_float32_matmul_precision (high: TF32 matmuls)")
    parser.add_argument("--blas", default=None, help="torch.backends.cuda.preferred_blas_library")
    parser.add_argument("--profile", action="store_true", help="the kernels at q = 3, 4, 5")
    args = parser.parse_args()
    torch.set_float32_matmul_precision(args.precision)
    if args.blas:
        torch.backends.cuda.preferred_blas_library(args.blas)
    print(f"matmul precision {args.precision}, blas {torch.backends.cuda.preferred_blas_library()}")
    engine = build_engine(device="cuda", cache_dir=tempfile.mkdtemp(), k=4, max_batch=args.batch,
                          cuda_graphs=False)
    target, cfg = engine.target, engine.config
    print(f"target: {cfg}", flush=True)
    dev = engine.device
    b = args.batch
    slots = torch.arange(b, device=dev)
    for q in range(1, 10):
        tokens = torch.randint(0, cfg.vocab_size, (b, q), device=dev)
        positions = (torch.full((b, 1), 100, device=dev) + torch.arange(q, device=dev))

        def run(tokens: Any = tokens, positions: Any = positions) -> Any:
            return target(tokens, positions, cache=engine.target_cache, slots=slots,
                          attend_len=cfg.max_seq_len, hidden_layers=engine.layer_ids)

        row = [f"q={q} rows={b * q}:", f"default {timed(run, args.reps):.3f} ms"]
        with sdpa_kernel([SDPBackend.MATH]):
            row.append(f"math {timed(run, args.reps):.3f} ms")
        x = torch.randn(b * q, cfg.d_model, device=dev)
        lin = target.blocks[0].attn.qkv
        row.append(f"qkv linear {timed(lambda lin=lin, x=x: lin(x), args.reps) * 1e3:.1f} us")
        print("  ".join(row), flush=True)
    if not args.profile:
        return
    # The kernels of one eager forward at q = 3, 4 and 5 (where verify's cost halves).
    from torch.profiler import ProfilerActivity, profile

    for q in (3, 4, 5):
        tokens = torch.randint(0, cfg.vocab_size, (b, q), device=dev)
        positions = (torch.full((b, 1), 100, device=dev) + torch.arange(q, device=dev))
        for _ in range(3):
            target(tokens, positions, cache=engine.target_cache, slots=slots,
                   attend_len=cfg.max_seq_len, hidden_layers=engine.layer_ids)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                target(tokens, positions, cache=engine.target_cache, slots=slots,
                       attend_len=cfg.max_seq_len, hidden_layers=engine.layer_ids)
            torch.cuda.synchronize()
        print(f"q={q}: kernels of 20 eager forwards")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10,
                                        max_name_column_width=70), flush=True)


if __name__ == "__main__":
    main()
