"""Cost of the transformers instrumentor on real assisted generation.

A small Llama built from a config (no download, seeded) generates with an assistant (the same
architecture, smaller, trained on nothing: acceptance is whatever it is; the point is the cost of
the instrumentation, which is per cycle). Rounds alternate uninstrumented and instrumented
``generate(..., assistant_model=...)`` calls; reported: time per generate (median), the ratio
instrumented / uninstrumented, cycles per generate, and the phase split specobs measured.

    PYTHONPATH=. python benchmarks/transformers_overhead.py --device cpu
    PYTHONPATH=. python benchmarks/transformers_overhead.py --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import transformers

import specobs
from specobs.instrument.transformers import TransformersInstrumentor


def build(device: str, big: bool) -> tuple[object, object, torch.Tensor]:
    torch.manual_seed(0)

    def cfg(hidden: int, layers: int) -> object:
        return transformers.LlamaConfig(
            vocab_size=1024, hidden_size=hidden, intermediate_size=hidden * 3,
            num_hidden_layers=layers, num_attention_heads=max(4, hidden // 64),
            num_key_value_heads=max(2, hidden // 128), max_position_embeddings=1024,
            pad_token_id=0, bos_token_id=1, eos_token_id=None,
        )

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    target = transformers.LlamaForCausalLM(cfg(1024 if big else 128, 8 if big else 4))
    draft = transformers.LlamaForCausalLM(cfg(256 if big else 64, 2))
    target = target.to(device=device, dtype=dtype).eval()
    draft = draft.to(device=device, dtype=dtype).eval()
    prompt = torch.randint(2, 1024, (1, 32), device=device)
    return target, draft, prompt


def gen(target: object, draft: object, prompt: torch.Tensor, n: int) -> torch.Tensor:
    out: torch.Tensor = target.generate(  # type: ignore[attr-defined]
        prompt, assistant_model=draft, max_new_tokens=n, do_sample=False,
        num_assistant_tokens=4, num_assistant_tokens_schedule="constant",
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--new-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    dev = args.device
    if dev == "cuda" and not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    target, draft, prompt = build(dev, big=dev == "cuda")
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    for _ in range(2):
        gen(target, draft, prompt, args.new_tokens)
    sync()
    obs = specobs.configure(sinks=[], clock="auto")
    inst = TransformersInstrumentor()
    times: dict[str, list[float]] = {"off": [], "on": []}
    ref = gen(target, draft, prompt, args.new_tokens)
    for r in range(args.rounds):
        for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
            if mode == "on":
                inst.instrument(observer=obs)
            sync()
            t0 = time.perf_counter()
            out = gen(target, draft, prompt, args.new_tokens)
            sync()
            times[mode].append(time.perf_counter() - t0)
            if mode == "on":
                inst.uninstrument()
            assert torch.equal(out, ref), "instrumentation changed the output"
    obs.force_flush(timeout_seconds=30)
    s = obs.snapshot()
    obs.shutdown()
    off = statistics.median(times["off"])
    on = statistics.median(times["on"])
    gens = args.rounds
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, device {dev}"
          + (f" ({torch.cuda.get_device_name()})" if dev == "cuda" else ""))
    print(f"generate ({args.new_tokens} new tokens): uninstrumented {off * 1e3:.1f} ms, "
          f"instrumented {on * 1e3:.1f} ms, throughput ratio {off / on:.4f} "
          f"(median of {args.rounds}; runs off "
          + ", ".join(f"{t * 1e3:.0f}" for t in times["off"]) + "; on "
          + ", ".join(f"{t * 1e3:.0f}" for t in times["on"]) + ")")
    print(f"cycles per generate {s.cycles_total / gens:.1f}, acceptance "
          f"{(s.acceptance_rate or 0):.3f}, GPU-sampled cycles {s.sampled_cycles_total}")
    for clock in ("gpu", "host"):
        parts = []
        for p in s.phases:
            c = s.phase_count(p, clock)
            parts.append(f"{p} {s.phase_seconds_sum(p, clock) / c * 1e3:.3f} ms" if c else
                         f"{p} -")
        print(f"  {clock:4s} per cycle: " + ", ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
