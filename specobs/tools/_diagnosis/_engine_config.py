"""A speculation length schedule by batch size, written in each engine's own configuration syntax.

The advisor gives :class:`Band` s: batch sizes ``lo`` to ``hi`` (inclusive; ``hi`` None: no upper
bound) run best at speculation length ``k`` (0: no speculation there). :func:`render` turns them
into a snippet to paste, in the form each engine's users write it. What each engine makes of its
schedule, read from its code at the pinned releases (tests/test_engine_config_syntax.py feeds
every snippet to the engine's own parser and lookup and compares every batch size):

``vllm`` (0.33, 0.34)
    ``--speculative-config`` JSON keys ``num_speculative_tokens`` and
    ``num_speculative_tokens_per_batch_size``: a list of ``[first, last, k]`` entries, both ends
    inclusive, the first starting at 1, non-overlapping; a gap carries the previous k forward and
    so does everything past the last entry; every k is capped at ``num_speculative_tokens``,
    which must be at least 1 (``vllm/v1/spec_decode/dynamic/utils.py``). vLLM drops the schedule
    under data parallelism (``config/vllm.py``, ``_maybe_disable_dynamic_sd_for_data_parallel``).
``sglang`` (0.5.23)
    ``--speculative-adaptive --speculative-adaptive-config FILE``: a JSON object keyed by batch
    size (digit strings), each tier with its ``candidate_steps``; a batch runs in the tier of the
    largest key not above it, after SGLang pads the batch up to its next decode CUDA-graph size
    (``speculative/adaptive_spec_params.py``). One candidate per tier pins k there (the tier's
    acceptance feedback has nothing to switch to). ``--speculative-num-steps`` must be one of the
    candidates (``arg_groups/speculative_hook.py``). EAGLE and EAGLE3 with top-k 1 only.
``trtllm`` (TensorRT-LLM after 1.2, read from its main branch: no wheel can be had here)
    ``speculative_config.draft_len_schedule`` in the YAML given to ``trtllm-serve
    --extra_llm_api_options``: each key is the *last* batch size of its band, batch sizes above
    the largest key draft nothing, the draft length at the smallest key must equal
    ``max_draft_len`` and none may exceed it (``llmapi/llm_args.py``,
    ``_torch/speculative/utils.py``). Releases up to 1.2 read a key as the *first* batch size of
    its band instead; do not paste these snippets there. On the newest main a k = 0 band drafts
    one token for one-engine modes other than Eagle3 and MTP-Eagle (``min_runtime_draft_len``),
    and vanilla MTP ignores the schedule.
``table``
    A plain text table: batch sizes, k, measured or extrapolated.

Where the bands ask for what an engine cannot do, :func:`render` refuses with a ValueError that
names the band, the rule and the fix, rather than emit a schedule the engine would run
differently: a band's k above ``num_speculative_tokens``; for TensorRT-LLM, a k above the one at
batch size 1. Where the engine can do it with one more setting, the snippet carries that setting:
SGLang gets ``--cuda-graph-bs-decode`` with each band's last batch size added when one of them
is not among its default decode CUDA-graph sizes, since padding would otherwise move that band's
top batch sizes into the next tier. When no batch size up to ``max_batch`` speculates, every
engine's snippet says to turn speculation off instead of carrying an all-zero schedule.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "ENGINES",
    "SGLANG_CONFIG_FILE",
    "SGLANG_DEFAULT_GRAPH_SIZES",
    "Band",
    "mapping",
    "render",
    "sglang_default_graph_sizes",
]

ENGINES = ("vllm", "sglang", "trtllm", "table")

#: The file name the SGLang snippet writes its tiers to.
SGLANG_CONFIG_FILE = "specobs-adaptive-k.json"

#: SGLang's default decode CUDA-graph batch sizes when speculative decoding is on, as
#: ``(first, last, step)`` runs, the last one open-ended (SGLang 0.5.23,
#: ``generate_decode_cuda_graph_batch_sizes`` in ``arg_groups/cuda_graph_hook.py``).
SGLANG_DEFAULT_GRAPH_SIZES: tuple[tuple[int, int | None, int], ...] = (
    (1, 8, 1), (10, 32, 2), (40, 64, 4), (72, 256, 8), (272, None, 16),
)


@dataclass(frozen=True)
class Band:
    """Batch sizes ``lo`` to ``hi`` inclusive (``hi`` None: no upper bound) run best at
    speculation length ``k`` (0: no speculation); ``measured`` False: the advisor extrapolated
    it rather than measured it."""

    lo: int
    hi: int | None
    k: int
    measured: bool


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _span(band: Band) -> str:
    if band.hi is None:
        return f"{band.lo}+"
    return str(band.lo) if band.hi == band.lo else f"{band.lo}-{band.hi}"


def _validate(bands: Sequence[Band], max_batch: int, num_speculative_tokens: int | None) -> None:
    if not _is_int(max_batch) or max_batch < 1:
        raise ValueError(f"max_batch: expected an int >= 1, got {max_batch!r}")
    if num_speculative_tokens is not None and (
        not _is_int(num_speculative_tokens) or num_speculative_tokens < 1
    ):
        raise ValueError(
            f"num_speculative_tokens: expected None or an int >= 1, got {num_speculative_tokens!r}"
        )
    if isinstance(bands, (str, bytes)) or not isinstance(bands, Sequence) or not bands:
        raise ValueError(f"bands: expected a non-empty sequence of Band, got {bands!r}")
    expected_lo = 1
    for i, band in enumerate(bands):
        if not isinstance(band, Band):
            raise ValueError(f"bands[{i}]: expected a Band, got {band!r}")
        if not _is_int(band.lo) or band.lo != expected_lo:
            where = "start at batch size 1" if i == 0 else (
                f"start right after the previous band, at {expected_lo}")
            raise ValueError(
                f"bands[{i}]: expected the bands to be contiguous and {where}; got lo={band.lo!r}"
            )
        if band.hi is None:
            if i != len(bands) - 1:
                raise ValueError(
                    f"bands[{i}]: only the last band may be open-ended (hi=None); "
                    f"got hi=None on band {i} of {len(bands)}"
                )
        elif not _is_int(band.hi) or band.hi < band.lo:
            raise ValueError(f"bands[{i}]: expected hi >= lo={band.lo} or None, got {band.hi!r}")
        if not _is_int(band.k) or band.k < 0:
            raise ValueError(f"bands[{i}] ({_span(band)}): expected k >= 0, got {band.k!r}")
        if not isinstance(band.measured, bool):
            raise ValueError(f"bands[{i}]: expected measured to be a bool, got {band.measured!r}")
        if num_speculative_tokens is not None and band.k > num_speculative_tokens:
            raise ValueError(
                f"band {_span(band)} asks k={band.k}, above num_speculative_tokens="
                f"{num_speculative_tokens}: an engine caps or refuses a k above the drafter's "
                f"configured length. Raise num_speculative_tokens to "
                f"{max(b.k for b in bands)} or lower that band's k"
            )
        if band.hi is not None:
            expected_lo = band.hi + 1
    last = bands[-1]
    if last.hi is not None and last.hi < max_batch:
        raise ValueError(
            f"bands: expected them to cover batch sizes 1 to max_batch={max_batch}; they end at "
            f"{last.hi}. End the last band with hi=None, or at {max_batch} or above"
        )


def _runs(bands: Sequence[Band], max_batch: int) -> list[tuple[int, int, int]]:
    """The bands as ``(first, last, k)`` within 1..max_batch, neighbours of equal k merged (the
    engines read a merged schedule exactly as the unmerged one)."""
    runs: list[tuple[int, int, int]] = []
    for band in bands:
        if band.lo > max_batch:
            break
        last = max_batch if band.hi is None else min(band.hi, max_batch)
        if runs and runs[-1][2] == band.k:
            runs[-1] = (runs[-1][0], last, band.k)
        else:
            runs.append((band.lo, last, band.k))
    return runs


def mapping(bands: Sequence[Band], max_batch: int = 256) -> dict[int, int]:
    """k for every batch size from 1 to ``max_batch``, after the same checks as :func:`render`."""
    _validate(bands, max_batch, None)
    return {b: k for first, last, k in _runs(bands, max_batch) for b in range(first, last + 1)}


def sglang_default_graph_sizes(max_bs: int) -> list[int]:
    """The decode CUDA-graph batch sizes SGLang captures by default with speculative decoding,
    up to ``max_bs`` (which it always includes)."""
    sizes = [
        size
        for first, last, step in SGLANG_DEFAULT_GRAPH_SIZES
        for size in range(first, (max_bs if last is None else last) + 1, step)
        if size <= max_bs
    ]
    return sizes if max_bs in sizes else [*sizes, max_bs]


# -- the engines' snippets -------------------------------------------------------------------------


def _off(engine: str, max_batch: int) -> str:
    how = {
        "vllm": "start vLLM without --speculative-config",
        "sglang": "start SGLang without --speculative-algorithm and its --speculative-* flags",
        "trtllm": "remove speculative_config from the trtllm-serve --extra_llm_api_options YAML",
    }[engine]
    return (f"# No batch size from 1 to {max_batch} gains from speculation: turn speculation off "
            f"({how}).\n")


def _vllm(runs: list[tuple[int, int, int]], num_speculative_tokens: int) -> str:
    fragment = {
        "num_speculative_tokens": num_speculative_tokens,
        "num_speculative_tokens_per_batch_size": [list(run) for run in runs],
    }
    return ("# vLLM: add these two keys to the JSON of --speculative-config; its method and model "
            "keys stay as configured.\n" + json.dumps(fragment) + "\n")


def _sglang(runs: list[tuple[int, int, int]], max_batch: int) -> str:
    # One tier a line: the JSON stays short enough to read against the table.
    tiers = ",\n".join(
        f'  {json.dumps(str(first))}: {json.dumps({"candidate_steps": [k]})}'
        for first, _, k in runs
    )
    steps = max(k for _, _, k in runs)
    lines = [
        "# SGLang (EAGLE or EAGLE3, --speculative-eagle-topk 1): each key is the first batch size "
        "of its tier; one candidate step pins k there.",
        f"cat > {SGLANG_CONFIG_FILE} <<'EOF'",
        "{\n" + tiers + "\n}",
        "EOF",
        "# Add to the server's flags (leave --speculative-num-draft-tokens unset):",
    ]
    flags = (f"--speculative-adaptive --speculative-adaptive-config {SGLANG_CONFIG_FILE} "
             f"--speculative-num-steps {steps}")
    default = sglang_default_graph_sizes(max_batch)
    ends = sorted({last for _, last, _ in runs[:-1]} - set(default))
    if ends:
        which = (f"batch size {ends[0]} ends a band but is not a default graph size"
                 if len(ends) == 1 else
                 f"batch sizes {', '.join(map(str, ends))} end bands but are not default graph "
                 "sizes")
        lines.append(
            "# SGLang pads a batch up to its next CUDA-graph size before choosing the tier; "
            f"{which}, so the sizes below add it (or add it to your own --cuda-graph-bs-decode)."
        )
        flags += " --cuda-graph-bs-decode " + " ".join(map(str, sorted({*default, *ends})))
    lines.append(flags)
    return "\n".join(lines) + "\n"


def _trtllm(runs: list[tuple[int, int, int]]) -> str:
    first_k = runs[0][2]
    for first, last, k in runs[1:]:
        if k > first_k:
            raise ValueError(
                f"TensorRT-LLM needs the draft length at batch size 1 (max_draft_len, k={first_k} "
                f"here) to be the largest in its draft_len_schedule; got k={k} for batch sizes "
                f"{first}-{last}. Its schedule cannot express a k that rises with batch size"
            )
    # Above the largest key TensorRT-LLM drafts nothing, so a last band of k = 0 needs no key.
    keyed = runs[:-1] if runs[-1][2] == 0 else runs
    lines = [
        "# TensorRT-LLM after 1.2: merge into the YAML given to trtllm-serve "
        "--extra_llm_api_options; decoding_type and speculative_model stay as configured, "
        "max_concurrency must go.",
        f"# Each key is the last batch size of its band; above {keyed[-1][1]} nothing is drafted "
        "(render for the server's max_batch_size). Releases up to 1.2 read keys as first batch "
        "sizes: do not use there.",
        "speculative_config:",
        f"  max_draft_len: {first_k}",
        "  draft_len_schedule:",
        *(f"    {last}: {k}" for _, last, k in keyed),
    ]
    return "\n".join(lines) + "\n"


def _table(bands: Sequence[Band], off: bool, max_batch: int) -> str:
    rows = [("batch size", "k", "source")] + [
        (_span(b), str(b.k), "measured" if b.measured else "extrapolated") for b in bands
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    text = "\n".join(
        f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]}" for row in rows) + "\n"
    if off:
        text += (f"No batch size from 1 to {max_batch} gains from speculation: turn speculation "
                 "off.\n")
    return text


def render(bands: Sequence[Band], engine: str, *, max_batch: int = 256,
           num_speculative_tokens: int | None = None) -> str:
    """The schedule as a snippet for ``engine`` (one of :data:`ENGINES`), covering batch sizes 1
    to ``max_batch`` (the engine's largest batch: vLLM's ``max_num_seqs``, SGLang's largest
    running batch, TensorRT-LLM's ``max_batch_size``).

    ``num_speculative_tokens`` is the drafter's configured length where it is fixed (vLLM's
    ``num_speculative_tokens``, SGLang's ``--speculative-num-steps``, TensorRT-LLM's
    ``max_draft_len``): a band asking for more is refused; None lets each snippet set what the
    bands need. Raises ValueError for bands that are not contiguous from 1, do not reach
    ``max_batch``, have k < 0, for an unknown engine, and for what the engine cannot express
    (the module docstring lists it)."""
    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {', '.join(ENGINES)}; got {engine!r}")
    _validate(bands, max_batch, num_speculative_tokens)
    runs = _runs(bands, max_batch)
    off = all(k == 0 for _, _, k in runs)
    if engine == "table":
        return _table(bands, off, max_batch)
    if off:
        return _off(engine, max_batch)
    if engine == "vllm":
        return _vllm(runs, num_speculative_tokens or max(k for _, _, k in runs))
    if engine == "sglang":
        return _sglang(runs, max_batch)
    return _trtllm(runs)
