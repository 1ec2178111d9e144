"""Settings: from arguments, then ``SPECOBS_*`` environment variables, then defaults.

Every environment variable is a named constant below with its own docstring. Invalid values raise
:class:`~specobs.ConfigurationError` at configuration time, naming the variable, what was expected
and what was got — never later on the hot path.
"""

from __future__ import annotations

import math
import os
import re
import reprlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from specobs._errors import ConfigurationError
from specobs.catalog import (
    DEFAULT_MAX_LABEL_VALUE_LENGTH,
    MAX_LABEL_VALUE_LENGTH,
    label_value_problem,
)

__all__ = [
    "DEFAULT_PHASES",
    "DEFAULT_PROMETHEUS_PORT",
    "SETTINGS",
    "Setting",
    "Settings",
    "resolve_settings",
]

DEFAULT_PHASES: tuple[str, ...] = ("draft", "verify", "bookkeeping")
#: The largest draft length a configuration accepts (bounds the ``position`` label).
MAX_DRAFT_LENGTH = 64
DEFAULT_PROMETHEUS_PORT = 9477

SPECOBS_ENABLED = "SPECOBS_ENABLED"
"""``0``/``false`` turns every specobs call into a no-op without touching the engine's code."""

SPECOBS_PHASES = "SPECOBS_PHASES"
"""Comma-separated phase names in cycle order. Default ``draft,verify,bookkeeping``."""

SPECOBS_SAMPLE_EVERY = "SPECOBS_SAMPLE_EVERY"
"""Time one cycle in N on the GPU clock. Unset: adaptive, under ``SPECOBS_OVERHEAD_BUDGET``."""

SPECOBS_OVERHEAD_BUDGET = "SPECOBS_OVERHEAD_BUDGET"
"""Adaptive sampling keeps GPU-timing cost under this fraction of cycle time. Default 0.002."""

SPECOBS_CLOCK = "SPECOBS_CLOCK"
"""``auto`` (CUDA events when torch sees a GPU), ``cuda`` (required) or ``host`` (never events)."""

SPECOBS_QUEUE_SIZE = "SPECOBS_QUEUE_SIZE"
"""Most cycle records waiting for the resolver; when full the oldest is dropped and counted."""

SPECOBS_EVENT_POOL_SIZE = "SPECOBS_EVENT_POOL_SIZE"
"""CUDA events created and pre-recorded up front. When the pool runs dry a cycle is not
GPU-timed."""

SPECOBS_MAX_DRAFT_LENGTH = "SPECOBS_MAX_DRAFT_LENGTH"
"""Largest draft length k: bounds the ``position`` label and the accept-length buckets (0..k+1)."""

SPECOBS_LABELS = "SPECOBS_LABELS"
"""Constant labels on every series, ``model=llama-3-8b,engine=sglang``."""

SPECOBS_MAX_LABEL_VALUE_LENGTH = "SPECOBS_MAX_LABEL_VALUE_LENGTH"
"""Longest label value, in characters (default 256, at most 16384): every series repeats each
constant label, so a longer one is refused at ``configure()`` rather than multiplied by every
scrape and export."""

SPECOBS_BASELINE_TOKENS_PER_SECOND = "SPECOBS_BASELINE_TOKENS_PER_SECOND"
"""Non-speculative decode rate of one sequence, tokens/s: the baseline speculation must beat."""

SPECOBS_PROMETHEUS_PORT = "SPECOBS_PROMETHEUS_PORT"
"""Port of the Prometheus endpoint. Default 9477."""

SPECOBS_PROMETHEUS_ADDR = "SPECOBS_PROMETHEUS_ADDR"
"""Address the Prometheus endpoint binds. Default ``127.0.0.1``; ``0.0.0.0`` to be scraped
remotely."""

SPECOBS_EXPORTERS = "SPECOBS_EXPORTERS"
"""Sinks ``configure()`` starts when none are passed: ``prometheus``, ``otlp``, both or ``none``."""

SPECOBS_TRACE_HEAD_RATE = "SPECOBS_TRACE_HEAD_RATE"
"""Fraction of cycles exported as traces regardless of duration (GPU-timed spans on GPU-sampled
cycles, host-timed otherwise). Default 0.001: one trace a second at 1,000 cycles/s."""

SPECOBS_TRACE_SLOW_CYCLE_SECONDS = "SPECOBS_TRACE_SLOW_CYCLE_SECONDS"
"""Every cycle at least this slow (GPU time when sampled, else host time) is traced (tail
sampling). Default: off."""

SPECOBS_IDLE_GAP_SECONDS = "SPECOBS_IDLE_GAP_SECONDS"
"""A gap between two cycles of one thread longer than this many seconds is the engine idling:
counted in ``specobs_cycle_idle_gaps_total``, not observed in ``specobs_cycle_gap_seconds``.
Default 1."""

SPECOBS_RANK = "SPECOBS_RANK"
"""This process's rank in a multi-process server (default: RANK / LOCAL_RANK, else 0)."""

SPECOBS_ALL_RANKS = "SPECOBS_ALL_RANKS"
"""``1``: every rank exports (with a ``rank`` label and port + rank). Default: rank 0 only."""

SPECOBS_EXIT_TIMEOUT_SECONDS = "SPECOBS_EXIT_TIMEOUT_SECONDS"
"""Most seconds the exit hook spends flushing every observer still open (records, the final
OTLP export) when the interpreter exits. Default 5."""

SPECOBS_OTLP_FORK_WAIT_SECONDS = "SPECOBS_OTLP_FORK_WAIT_SECONDS"
"""Most seconds ``fork()`` waits for specobs's own OTLP/gRPC export in progress. Default 0.5."""

DEFAULT_EXIT_TIMEOUT_SECONDS = 5.0
#: How long ``fork()`` waits for specobs's own OTLP/gRPC export in progress (see
#: ``specobs.sinks.otlp``): a child forked while one still runs cannot use gRPC.
DEFAULT_OTLP_FORK_WAIT_SECONDS = 0.5

ClockMode = Literal["auto", "cuda", "host"]
_PHASE_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RESERVED_LABELS = frozenset(
    {"phase", "clock", "position", "reason", "component", "kind", "le", "dp_rank"}
)


@dataclass(frozen=True)
class Settings:
    """Validated settings of one observer."""

    enabled: bool = True
    phases: tuple[str, ...] = DEFAULT_PHASES
    sample_every: int | None = None
    overhead_budget: float = 0.002
    clock: ClockMode = "auto"
    queue_size: int = 8192
    event_pool_size: int = 2048
    max_draft_length: int = 8
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Longest value a label may have, in characters: constant labels longer than this are a
    #: ConfigurationError; a value that reaches the exporters otherwise is cut to it, counted.
    max_label_value_length: int = DEFAULT_MAX_LABEL_VALUE_LENGTH
    baseline_tokens_per_second: float | None = None
    poll_interval_seconds: float = 0.1
    #: How long the resolver holds a cycle ended by ``defer()`` for its ``settle()``; then it is
    #: counted with its times and without its tokens (``dropped_records{reason="unsettled"}``).
    settle_timeout_seconds: float = 5.0
    trace_head_rate: float = 0.001
    trace_slow_cycle_seconds: float | None = None
    #: A gap between two cycles of one thread longer than this is idling, not overhead: counted
    #: in ``specobs_cycle_idle_gaps_total`` instead of ``specobs_cycle_gap_seconds``.
    idle_gap_seconds: float = 1.0
    rank: int = 0
    all_ranks: bool = False
    replica: int | None = None
    """Data-parallel replica this process serves, when the server runs several (``dp_rank``)."""
    replicas: int = 1
    leader: bool | None = None
    """Whether this process records when one process per replica does (default: rank 0)."""
    integration: str = "manual"
    """Which integration records: ``manual`` (the API), or an instrumentor's name."""


def _env(name: str, env: Mapping[str, str]) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def _parse_int(name: str, raw: str, *, minimum: int, maximum: int | None = None) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(
            f"{name} must be an integer >= {minimum}, got {raw!r}"
        ) from None
    return _check_int(name, value, minimum=minimum, maximum=maximum)


def _check_int(name: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(
            f"{name} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})"
        )
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise ConfigurationError(f"{name} must be an integer {bound}, got {value}")
    return value


def _parse_float(name: str, raw: object, *, low: float, high: float, open_low: bool) -> float:
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigurationError(f"{name} must be a number, got {raw!r}") from None
    ok = (value > low if open_low else value >= low) and value <= high and math.isfinite(value)
    if not ok:
        lo = "(" if open_low else "["
        raise ConfigurationError(f"{name} must be in {lo}{low}, {high}], got {raw!r}")
    return value


def _parse_bool(name: str, raw: str) -> bool:
    low = raw.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{name} must be one of 1/0/true/false/yes/no/on/off, got {raw!r}")


def parse_phases(name: str, value: object) -> tuple[str, ...]:
    """Validate a phase list given as a comma-separated string or a sequence of names."""
    if isinstance(value, str):
        items = [p.strip() for p in value.split(",")]
    elif isinstance(value, Sequence):
        items = list(value)
    else:
        raise ConfigurationError(
            f"{name} must be a sequence of phase names, got {type(value).__name__}"
        )
    if len(items) < 1:
        raise ConfigurationError(f"{name} must name at least one phase, got none")
    for item in items:
        if not isinstance(item, str) or not _PHASE_RE.match(item):
            raise ConfigurationError(
                f"{name}: each phase must be a lowercase identifier (a-z, 0-9, _; at most 32 "
                f"characters, starting with a letter), got {item!r}"
            )
    if len(set(items)) != len(items):
        raise ConfigurationError(f"{name}: phase names must be unique, got {items!r}")
    if len(items) > 16:
        raise ConfigurationError(f"{name}: at most 16 phases, got {len(items)}")
    return tuple(items)


def parse_labels(name: str, value: object) -> dict[str, str]:
    """Validate constant labels given as ``a=b,c=d`` or a mapping."""
    if isinstance(value, str):
        pairs: dict[str, str] = {}
        for part in value.split(","):
            if not part.strip():
                continue
            key, sep, val = part.partition("=")
            if not sep:
                raise ConfigurationError(
                    f"{name} must be comma-separated key=value pairs, got {part.strip()!r}"
                )
            pairs[key.strip()] = val.strip()
        value = pairs
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"{name} must be a mapping of label to value, got {value!r}")
    out: dict[str, str] = {}
    for key, val in value.items():
        if not isinstance(key, str) or not _LABEL_RE.match(key) or key.startswith("__"):
            raise ConfigurationError(f"{name}: {key!r} is not a valid Prometheus label name")
        if key in _RESERVED_LABELS:
            raise ConfigurationError(
                f"{name}: label {key!r} is used by specobs series; choose another name"
            )
        if not isinstance(val, (str, int, float)):
            raise ConfigurationError(
                f"{name}: the value of label {key!r} must be a str (or a number), got "
                f"{type(val).__name__} {_short(val)}"
            )
        text = str(val)
        # The label rule's characters (its length is checked once max_label_value_length is
        # known: resolve_settings). Accepted, a control character or a lone surrogate (what
        # os.environ makes of bytes that are not UTF-8) would fail every scrape for the life of
        # the process.
        problem = label_value_problem(text, max_length=len(text))
        if problem is not None:
            raise ConfigurationError(
                f"{name}: the value of label {key!r} {problem}; got {_short(text)}")
        out[key] = text
    return out


def _check_label_lengths(settings: Settings, name: str) -> None:
    """Every constant label value within ``max_label_value_length`` (``name``: where the labels
    came from, for the message)."""
    for key, text in settings.labels.items():
        if len(text) > settings.max_label_value_length:
            raise ConfigurationError(
                f"{name}: the value of label {key!r} "
                f"{label_value_problem(text, settings.max_label_value_length)}; got "
                f"{_short(text)}; shorten it, or raise the limit")


def _short(value: object, limit: int = 60) -> str:
    """A bounded repr for messages."""
    text = reprlib.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _default_rank(env: Mapping[str, str]) -> int:
    for var in ("RANK", "LOCAL_RANK"):
        raw = _env(var, env)
        if raw is not None:
            return _parse_int(var, raw, minimum=0)
    return 0


# -- the settings table ------------------------------------------------------------------------
#: ``parse(name, value, from_env)``: the validated value, or ConfigurationError naming ``name``
#: (the argument or the variable), what was expected and what was got. ``from_env``: ``value``
#: is the text of a variable rather than a Python value.
Parser = Callable[[str, Any, bool], Any]


def _integer(minimum: int, maximum: int | None = None) -> Parser:
    def parse(name: str, value: Any, from_env: bool) -> int:
        if from_env:
            return _parse_int(name, value, minimum=minimum, maximum=maximum)
        return _check_int(name, value, minimum=minimum, maximum=maximum)

    return parse


def _number(low: float, high: float, *, open_low: bool) -> Parser:
    def parse(name: str, value: Any, from_env: bool) -> float:
        return _parse_float(name, value, low=low, high=high, open_low=open_low)

    return parse


def _boolean(name: str, value: Any, from_env: bool) -> bool:
    return _parse_bool(name, value) if from_env else bool(value)


def _clock(name: str, value: Any, from_env: bool) -> ClockMode:
    if value not in ("auto", "cuda", "host"):
        raise ConfigurationError(
            f"{name} must be one of 'auto', 'cuda', 'host', got {value!r}"
        )
    return cast(ClockMode, value)


def _integration(name: str, value: Any, from_env: bool) -> str:
    text = str(value)
    if not re.fullmatch(r"[a-z0-9_.-]{1,64}", text):
        raise ConfigurationError(
            f"{name} must be 1-64 characters of a-z, 0-9, '_', '.', '-', got {value!r}"
        )
    return text


@dataclass(frozen=True)
class Setting:
    """One row of the settings table: a :class:`Settings` field, the ``SPECOBS_*`` variable it
    is read from when no argument is given (``None``: arguments only), and its parser, which
    holds the bounds."""

    field: str
    variable: str | None
    parse: Parser


#: Every setting, once. ``configure()`` takes each field as a keyword argument; arguments win
#: over the variables, which win over the :class:`Settings` defaults.
SETTINGS: tuple[Setting, ...] = (
    Setting("enabled", SPECOBS_ENABLED, _boolean),
    Setting("phases", SPECOBS_PHASES, lambda name, value, env: parse_phases(name, value)),
    Setting("sample_every", SPECOBS_SAMPLE_EVERY, _integer(1)),
    Setting("overhead_budget", SPECOBS_OVERHEAD_BUDGET, _number(0.0, 1.0, open_low=True)),
    Setting("clock", SPECOBS_CLOCK, _clock),
    Setting("queue_size", SPECOBS_QUEUE_SIZE, _integer(16, 10_000_000)),
    Setting("event_pool_size", SPECOBS_EVENT_POOL_SIZE, _integer(4, 1_000_000)),
    Setting("max_draft_length", SPECOBS_MAX_DRAFT_LENGTH, _integer(1, MAX_DRAFT_LENGTH)),
    Setting("labels", SPECOBS_LABELS, lambda name, value, env: parse_labels(name, value)),
    Setting("max_label_value_length", SPECOBS_MAX_LABEL_VALUE_LENGTH,
            _integer(1, MAX_LABEL_VALUE_LENGTH)),
    Setting("baseline_tokens_per_second", SPECOBS_BASELINE_TOKENS_PER_SECOND,
            _number(0.0, 1e9, open_low=True)),
    Setting("poll_interval_seconds", None, _number(0.0, 86400.0, open_low=True)),
    Setting("settle_timeout_seconds", None, _number(0.0, 86400.0, open_low=False)),
    Setting("trace_head_rate", SPECOBS_TRACE_HEAD_RATE, _number(0.0, 1.0, open_low=False)),
    Setting("trace_slow_cycle_seconds", SPECOBS_TRACE_SLOW_CYCLE_SECONDS,
            _number(0.0, 3600.0, open_low=True)),
    Setting("idle_gap_seconds", SPECOBS_IDLE_GAP_SECONDS, _number(0.0, 86400.0, open_low=True)),
    Setting("rank", SPECOBS_RANK, _integer(0)),
    Setting("all_ranks", SPECOBS_ALL_RANKS, _boolean),
    Setting("replica", None, _integer(0, 65534)),
    Setting("replicas", None, _integer(1, 65535)),
    Setting("leader", None, _boolean),  # None (not given) is never parsed: rank 0 leads
    Setting("integration", None, _integration),
)
_BY_FIELD = {s.field: s for s in SETTINGS}


def resolve_settings(
    *, env: Mapping[str, str] | None = None, base: Settings | None = None, **arguments: Any
) -> Settings:
    """Arguments over ``SPECOBS_*`` variables over defaults (or over ``base``), each validated.

    An argument that is ``None`` counts as not given. Unknown names raise ConfigurationError.
    With ``base``, the variables are not read: ``base`` already holds what they would give.
    """
    unknown = sorted(set(arguments) - set(_BY_FIELD))
    if unknown:
        raise ConfigurationError(
            f"unknown setting {unknown[0]!r}; expected one of {', '.join(sorted(_BY_FIELD))}"
        )
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        value = arguments.get(setting.field)
        if value is not None:
            values[setting.field] = setting.parse(setting.field, value, False)
            continue
        if base is not None:
            continue
        if setting.variable is not None:
            raw = _env(setting.variable, env)
            if raw is not None:
                values[setting.field] = setting.parse(setting.variable, raw, True)
    if base is None and "rank" not in values:
        values["rank"] = _default_rank(env)
    settings = replace(base or Settings(), **values)
    from_env = "labels" not in arguments and base is None and _env(SPECOBS_LABELS, env)
    _check_label_lengths(settings, SPECOBS_LABELS if from_env else "labels")
    if settings.replica is not None and settings.replica >= settings.replicas:
        raise ConfigurationError(
            f"replica must be an integer between 0 and {settings.replicas - 1} "
            f"(replicas={settings.replicas}), got {settings.replica}"
        )
    return settings


def prometheus_port(env: Mapping[str, str] | None = None) -> int:
    """The Prometheus port from ``SPECOBS_PROMETHEUS_PORT`` (default 9477), validated."""
    env = os.environ if env is None else env
    raw = _env(SPECOBS_PROMETHEUS_PORT, env)
    if raw is None:
        return DEFAULT_PROMETHEUS_PORT
    return _parse_int(SPECOBS_PROMETHEUS_PORT, raw, minimum=0, maximum=65535)


def prometheus_addr(env: Mapping[str, str] | None = None) -> str:
    """The bind address from ``SPECOBS_PROMETHEUS_ADDR`` (default loopback)."""
    env = os.environ if env is None else env
    return _env(SPECOBS_PROMETHEUS_ADDR, env) or "127.0.0.1"


def exporters(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Sink names from ``SPECOBS_EXPORTERS``; empty when unset."""
    env = os.environ if env is None else env
    raw = _env(SPECOBS_EXPORTERS, env)
    if raw is None:
        return ()
    # Each sink once, in the order given: a name listed twice would start two endpoints.
    names = tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))
    for n in names:
        if n not in ("prometheus", "otlp", "none"):
            raise ConfigurationError(
                f"{SPECOBS_EXPORTERS} must list 'prometheus', 'otlp' or 'none', got {n!r}"
            )
    return tuple(n for n in names if n != "none")


def env_flag(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether the switch variable ``name`` is on (``1``, ``true``, ``yes``, ``on``, any case).

    For switches read where raising is not an option (an engine's plugin loader): anything else,
    or unset, is off."""
    raw = (os.environ if env is None else env).get(name, "")
    return raw.strip().lower() in ("1", "true", "yes", "on")


def otlp_fork_wait_seconds(env: Mapping[str, str] | None = None) -> float:
    """``SPECOBS_OTLP_FORK_WAIT_SECONDS`` (default 0.5, 0 to 60): how long ``fork()`` waits for
    an OTLP/gRPC export in progress. Read when an OTLP sink is made; a bad value raises
    :class:`~specobs.ConfigurationError` there."""
    raw = _env(SPECOBS_OTLP_FORK_WAIT_SECONDS, os.environ if env is None else env)
    if raw is None:
        return DEFAULT_OTLP_FORK_WAIT_SECONDS
    return _parse_float(SPECOBS_OTLP_FORK_WAIT_SECONDS, raw, low=0.0, high=60.0,
                        open_low=False)


def exit_timeout_seconds(env: Mapping[str, str] | None = None) -> float:
    """``SPECOBS_EXIT_TIMEOUT_SECONDS`` (default 5). Read at exit, so a bad value cannot raise
    then: it is logged and the default is used."""
    env = os.environ if env is None else env
    raw = _env(SPECOBS_EXIT_TIMEOUT_SECONDS, env)
    if raw is None:
        return DEFAULT_EXIT_TIMEOUT_SECONDS
    try:
        return _parse_float(SPECOBS_EXIT_TIMEOUT_SECONDS, raw, low=0.0, high=3600.0,
                            open_low=False)
    except ConfigurationError as exc:
        import logging

        logging.getLogger("specobs").warning("specobs: %s; using %g s", exc,
                                             DEFAULT_EXIT_TIMEOUT_SECONDS)
        return DEFAULT_EXIT_TIMEOUT_SECONDS
