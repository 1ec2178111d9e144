"""A tensor that notes the arithmetic made on it: what an instrumentor would launch as kernels
on the engine's stream were the tensor on the GPU."""

from __future__ import annotations

from typing import Any

ARITHMETIC = ("sub", "add", "clamp", "ne", "eq", "sum")


def watching(tensor: Any, seen: list[str]) -> Any:
    """``tensor`` as a subclass whose every arithmetic call (:data:`ARITHMETIC`, in-place and
    reflected forms too) is appended to ``seen`` by name."""
    import torch

    class Watched(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:  # fmt: skip
            name = getattr(func, "__name__", "")
            if name.strip("_").removeprefix("r").rstrip("_") in ARITHMETIC:
                seen.append(name)
            return super().__torch_function__(func, types, args, kwargs or {})

    return tensor.as_subclass(Watched)
