"""The fault schedule of ``specobs fleet-sim``: which fault hits which servers, when.

A schedule is a YAML or JSON file, or ``--fault`` flags, or both::

    faults:
      - {kind: acceptance_collapse, servers: [3], at: 90s, factor: 0.3}
      - {kind: verify_slowdown, servers: [9, 17], at: 2m, factor: 2.5}
      - {kind: stall, servers: [21], at: 2m}
      - {kind: exporter_down, servers: [30], at: 2m, duration: 5m}
      - {kind: bad_rollout, model: llama-3.1-8b, at: 3m, factor: 0.3}

The same as flags: ``--fault "acceptance_collapse servers=3 at=90s factor=0.3"``
(``servers=3,7`` for several; ``model=NAME`` for a rollout).

``at`` counts from the simulator's start; ``duration`` (optional) ends the fault, otherwise it
lasts to the end of the run. ``factor`` scales the per-position acceptance (collapse, rollout) or
the verify phase's time (slowdown). Everything is checked up front, and an error names the fault,
the field, what was expected and what was given.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FAULT_KINDS", "Fault", "ScheduleError", "load_schedule", "parse_duration",
           "parse_fault_flag"]

#: Fault kinds and the default ``factor`` of each (None: the kind takes no factor).
FAULT_KINDS: dict[str, float | None] = {
    "acceptance_collapse": 0.3,  # per-position acceptance x factor on the chosen servers
    "verify_slowdown": 2.5,  # verify phase time x factor on both clocks
    "stall": None,  # cycles stop while requests stay running (the engine hangs)
    "exporter_down": None,  # /metrics answers 503 (the specobs endpoint is broken)
    "bad_rollout": 0.3,  # every server of one model restarts as a new pod, acceptance x factor
}

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class ScheduleError(ValueError):
    """A fault schedule (file or ``--fault`` flag) that cannot be used; the message says why."""


def parse_duration(value: object, where: str) -> float:
    """Seconds from ``90``, ``90s``, ``1.5m``, ``2h`` or ``500ms``."""
    if isinstance(value, bool):
        raise ScheduleError(f"{where}: expected a duration such as 90s or 2m, got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value).strip())
        if m is None:
            raise ScheduleError(
                f"{where}: expected a duration such as 90s, 2m or 1h, got {value!r}")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds < 0:
        raise ScheduleError(f"{where}: a duration cannot be negative, got {value!r}")
    return seconds


@dataclass(frozen=True)
class Fault:
    """One scheduled fault. ``servers`` are indexes into the fleet (0..N-1); a rollout names a
    ``model`` instead."""

    kind: str
    at_seconds: float
    servers: tuple[int, ...] = ()
    model: str | None = None
    factor: float | None = None
    duration_seconds: float | None = None

    def active(self, elapsed_seconds: float) -> bool:
        if elapsed_seconds < self.at_seconds:
            return False
        return self.duration_seconds is None or (
            elapsed_seconds < self.at_seconds + self.duration_seconds)

    def describe(self) -> str:
        target = f"model={self.model}" if self.model else "servers=" + ",".join(
            map(str, self.servers))
        extra = f" factor={self.factor:g}" if self.factor is not None else ""
        dur = f" duration={self.duration_seconds:g}s" if self.duration_seconds is not None else ""
        return f"{self.kind} {target} at={self.at_seconds:g}s{extra}{dur}"


_FIELDS = {"kind", "servers", "model", "at", "factor", "duration"}


def _fault(raw: object, where: str, n_servers: int, models: tuple[str, ...]) -> Fault:
    if not isinstance(raw, dict):
        raise ScheduleError(f"{where}: expected a mapping with kind, at and servers or model, "
                            f"got {raw!r}")
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise ScheduleError(f"{where}: unknown field(s) {unknown}; allowed: {sorted(_FIELDS)}")
    kind = raw.get("kind")
    if kind not in FAULT_KINDS:
        raise ScheduleError(f"{where}: kind must be one of {sorted(FAULT_KINDS)}, got {kind!r}")
    if "at" not in raw:
        raise ScheduleError(f"{where}: missing 'at' (when the fault starts, e.g. at: 90s)")
    at = parse_duration(raw["at"], f"{where}.at")
    duration = (parse_duration(raw["duration"], f"{where}.duration")
                if raw.get("duration") is not None else None)
    factor = _factor(raw, kind, where)
    if kind == "bad_rollout":
        model = raw.get("model")
        if "servers" in raw:
            raise ScheduleError(f"{where}: bad_rollout takes model, not servers")
        if model not in models:
            raise ScheduleError(f"{where}.model: expected one of the fleet's models {list(models)},"
                                f" got {model!r}")
        return Fault(kind, at, model=str(model), factor=factor, duration_seconds=duration)
    if "model" in raw:
        raise ScheduleError(f"{where}: {kind} takes servers, not model")
    return Fault(kind, at, servers=_servers(raw.get("servers"), where, n_servers), factor=factor,
                 duration_seconds=duration)


def _factor(raw: dict[str, Any], kind: str, where: str) -> float | None:
    """The fault's factor: as given (a number > 0, for a kind that takes one), or its kind's."""
    if "factor" not in raw:
        return FAULT_KINDS[kind]
    if FAULT_KINDS[kind] is None:
        raise ScheduleError(f"{where}: kind {kind} takes no factor")
    try:
        factor = float(raw["factor"])
    except (TypeError, ValueError):
        raise ScheduleError(f"{where}.factor: expected a number, got {raw['factor']!r}") from None
    if not factor > 0:
        raise ScheduleError(f"{where}.factor: must be > 0, got {factor:g}")
    return factor


def _servers(servers: object, where: str, n_servers: int) -> tuple[int, ...]:
    """The server indexes a fault hits: one index or a non-empty list, each in 0..n-1."""
    if isinstance(servers, int) and not isinstance(servers, bool):
        servers = [servers]
    if not isinstance(servers, list) or not servers:
        raise ScheduleError(f"{where}.servers: expected a list of server indexes, got {servers!r}")
    for s in servers:
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < n_servers:
            raise ScheduleError(
                f"{where}.servers: {s!r} is not a server index in 0..{n_servers - 1}")
    return tuple(sorted(set(servers)))


def parse_fault_flag(text: str) -> dict[str, Any]:
    """``"stall servers=3,7 at=90s"`` -> the mapping a schedule file would hold."""
    tokens = text.split()
    if not tokens:
        raise ScheduleError("--fault: empty; expected e.g. 'stall servers=3 at=90s'")
    raw: dict[str, Any] = {"kind": tokens[0]}
    for token in tokens[1:]:
        key, sep, value = token.partition("=")
        if not sep or not value:
            raise ScheduleError(f"--fault {text!r}: expected key=value, got {token!r}")
        if key == "servers":
            try:
                raw[key] = [int(v) for v in value.split(",")]
            except ValueError:
                raise ScheduleError(f"--fault {text!r}: servers must be integers such as 3,7; "
                                    f"got {value!r}") from None
        else:
            raw[key] = value
    return raw


def load_schedule(path: str | Path | None, flags: list[str], n_servers: int,
                  models: tuple[str, ...]) -> list[Fault]:
    """Faults from a YAML/JSON file and ``--fault`` flags, validated against the fleet."""
    raws: list[tuple[str, object]] = []
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as exc:
            raise ScheduleError(f"cannot read fault schedule {p}: {exc.strerror or exc}") from None
        try:
            if p.suffix == ".json":
                doc = json.loads(text)
            else:
                try:
                    import yaml
                except ImportError:
                    raise ScheduleError(f"{p}: reading YAML needs PyYAML: pip install "
                                        "'specobs[gen]' (or write the schedule as .json)") from None
                doc = yaml.safe_load(text)
        except (ValueError, Exception) as exc:  # yaml.YAMLError is not importable without yaml
            if isinstance(exc, ScheduleError):
                raise
            raise ScheduleError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: "
                                f"{exc}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("faults"), list):
            raise ScheduleError(f"{p}: expected a mapping with a list under 'faults', got "
                                f"{type(doc).__name__}")
        raws += [(f"{p}: faults[{i}]", f) for i, f in enumerate(doc["faults"])]
    raws += [(f"--fault {f!r}", parse_fault_flag(f)) for f in flags]
    return [_fault(raw, where, n_servers, models) for where, raw in raws]
