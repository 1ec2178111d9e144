"""Where a CUDA acceptance copy's cost on the engine's thread goes: the tensor's attributes the
native core reads, the runtime's ``cudaMemcpyAsync`` alone (through ctypes, whose own call costs
~0.3 µs), with the event record, and the whole ``accept()``. Host ns per call, median, the ways
interleaved, the GPU kept busy by a matmul per iteration (every CUDA call only a launch).

    PYTHONPATH=. python benchmarks/diag/copy_parts.py [--n 20000]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys

import torch

import specobs

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from acceptance_paths import time_ways


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    args = ap.parse_args()
    work = torch.randn(1024, 1024, device="cuda")
    obs = specobs.configure(sinks=[], clock="cuda")
    with obs.cycle() as c:  # starts the clock (its runtime functions, pinned slots)
        c.mark("verify")
        c.mark("bookkeeping")
    clock: object = obs.clock
    lib = clock._lib  # type: ignore[attr-defined]
    raw = torch._C._cuda_getCurrentRawStream
    dev = torch.tensor([1, 2, 0, 3, 1, 2, 0, 3], device="cuda")
    dst = torch.empty(8, dtype=torch.int64, pin_memory=True)
    ev = torch.cuda.Event()
    memcpy, record = lib.cudaMemcpyAsync, lib.cudaEventRecord
    memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                       ctypes.c_void_p]
    record.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    evh = ev.cuda_event
    lens = [1, 2, 0, 3, 1, 2, 0, 3]

    def attrs() -> None:
        _ = dev.dtype
        dev.numel()
        dev.is_contiguous()
        dev.get_device()
        dev.data_ptr()
        raw(0)

    def copy() -> None:
        memcpy(dst.data_ptr(), dev.data_ptr(), 64, 2, raw(0))

    def copy_record() -> None:
        s = raw(0)
        memcpy(dst.data_ptr(), dev.data_ptr(), 64, 2, s)
        record(evh, s)

    def nothing() -> None:
        pass

    ways = {
        "nothing": lambda c: nothing(), "attrs": lambda c: attrs(), "memcpy": lambda c: copy(),
        "memcpy+record": lambda c: copy_record(),
        "accept(cuda)": lambda c: c.accept(dev, draft_length=4),
        "accept(list)": lambda c: c.accept(lens, draft_length=4),
    }
    med = time_ways(obs, ways, args.n, batch=8, work=lambda: work @ work,
                    sync=torch.cuda.synchronize)  # fmt: skip
    print(f"{torch.cuda.get_device_name()}: host ns per call, median of {args.n // len(ways)}")
    for w, v in med.items():
        print(f"  {w:16s} {v:8.0f}")
    obs.shutdown(5)


if __name__ == "__main__":
    main()
