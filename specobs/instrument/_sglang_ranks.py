"""Where an SGLang scheduler process sits: its ranks, read from SGLang's objects.

The process that records is the TP rank 0 of the last pipeline stage of each data-parallel
replica (with DP attention: of each attention-DP group); replicas are told apart by
``dp_rank``. Plain functions, no state, no hooks.
"""

from __future__ import annotations

import sys
from typing import Any

from specobs.instrument import _base

__all__ = ["parallel_context", "pp_size", "topology_from", "topology_of"]


def topology_from(
    *,
    tp_rank: int,
    tp_size: int,
    pp_rank: int = 0,
    pp_size: int = 1,
    dp_rank: int | None = None,
    dp_ranks: int = 1,
    attn_dp_size: int = 1,
) -> _base.Topology:
    """Where a scheduler process sits, from SGLang's ranks and widths.

    ``dp_ranks`` counts the data-parallel units that each run their own batches: replicas
    (``--dp-size``, each with its own WORLD, so their WORLD ranks repeat) or attention-DP groups
    (``--enable-dp-attention``: one WORLD, TP ranks laid out DP-major). ``dp_rank`` is this
    process's unit, as SGLang's launcher hands it to the scheduler. The leader is the first TP
    rank of the unit on the last pipeline stage -- the only stage that runs the speculative
    worker's draft, verify and acceptance.
    """
    group = max(tp_size // max(attn_dp_size, 1), 1)
    local_tp = tp_rank % group
    last_stage = pp_rank == pp_size - 1
    replicas = max(dp_ranks, 1)
    replica = None
    if replicas > 1:
        replica = dp_rank if dp_rank is not None else tp_rank // group
        replica = min(max(replica, 0), replicas - 1)
    return _base.Topology(
        leader=local_tp == 0 and last_stage,
        rank=pp_rank * group + local_tp,
        replica=replica,
        replicas=replicas,
    )


def parallel_context() -> Any:
    """SGLang's published parallel context (0.5.23: ``runtime_context.get_parallel()``)."""
    module = sys.modules.get("sglang.srt.runtime_context")
    if module is None:
        return None
    try:
        parallel = module.get_parallel()
        int(parallel.tp_rank)  # raises when this process published no ranks
    except Exception:
        return None
    return parallel


def topology_of(worker: Any) -> _base.Topology:
    """The topology of the process running ``worker`` (a speculative worker of any release).

    Reads SGLang's runtime context when it is published (0.5.23), else the ranks the target
    ``TpModelWorker`` holds and the server arguments (older releases), else torch.distributed.
    """
    parallel = parallel_context()
    if parallel is not None:

        def read(name: str, default: Any) -> Any:
            try:
                value = getattr(parallel, name)
            except Exception:
                return default
            return default if value is None else value

        dp_size = int(read("dp_size", 1))
        attn_dp = int(read("attn_dp_size", 1))
        return topology_from(
            tp_rank=int(parallel.tp_rank), tp_size=int(read("tp_size", 1)),
            pp_rank=int(read("pp_rank", 0)), pp_size=int(read("pp_size", 1)),
            dp_rank=parallel.dp_rank if _has(parallel, "dp_rank") else None,
            dp_ranks=int(read("num_dp_ranks", dp_size * attn_dp)), attn_dp_size=attn_dp,
        )  # fmt: skip
    target = getattr(worker, "target_worker", None) or getattr(worker, "_target_worker", None)
    args = getattr(worker, "server_args", None) or getattr(target, "server_args", None)

    def rank(name: str) -> int | None:
        for holder in (worker, target):
            value = getattr(holder, name, None)
            if isinstance(value, int):
                return value
        return None

    tp_rank = rank("tp_rank")
    if tp_rank is None:
        tp_rank = _world_rank()
    dp_size = int(getattr(args, "dp_size", 1) or 1)
    attn_dp = dp_size if getattr(args, "enable_dp_attention", False) else 1
    return topology_from(
        tp_rank=tp_rank, tp_size=int(getattr(args, "tp_size", 0) or tp_rank + 1),
        pp_rank=rank("pp_rank") or 0, pp_size=int(getattr(args, "pp_size", 1) or 1),
        dp_rank=rank("dp_rank"), dp_ranks=dp_size, attn_dp_size=attn_dp,
    )  # fmt: skip


def _has(obj: Any, name: str) -> bool:
    try:
        getattr(obj, name)
    except Exception:
        return False
    return True


def _world_rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    return 0


def pp_size(worker: Any) -> int:
    parallel = parallel_context()
    if parallel is not None:
        try:
            return int(parallel.pp_size)
        except Exception:
            return 1
    args = getattr(worker, "server_args", None)
    return int(getattr(args, "pp_size", 1) or 1)

