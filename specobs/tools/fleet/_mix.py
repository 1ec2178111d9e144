"""The server kinds of ``specobs fleet-sim --engines``: which simulated servers run specobs's
plugin, which export only their engine's own series, and in what ratio.

A kind is one of:

- ``plugin``: specobs's plugin in vLLM or SGLang (alternating), its ``/metrics`` only: the fleet
  the simulator has always served, and the default.
- ``vllm+plugin``, ``sglang+plugin``: the plugin in that engine, and the engine's own endpoint on
  the same host as well (its own port and job), as a pod that runs both exporters has; the rules
  must count such a server once.
- an engine name from the rules' table (:data:`specobs.mixin._engines.ENGINES`: ``vllm``,
  ``sglang``, ``trtllm``, ``llamacpp``, ``lmdeploy``): no plugin, only the engine's own series.

``--engines vllm:3,sglang:3,plugin:4`` gives each kind a weight (default 1); the servers are
shared out by weight and laid out in blocks, in the order given, so fault indexes stay easy to
aim.
"""

from __future__ import annotations

from dataclasses import dataclass

from specobs.mixin import _engines

__all__ = ["DEFAULT_MIX", "PLUGIN_ENGINES", "MixError", "ServerKind", "describe_layout",
           "kinds", "layout", "parse_mix"]

#: The engines the simulated plugin runs in, with the integration ``specobs_info`` names.
PLUGIN_ENGINES: tuple[tuple[str, str], ...] = (("vllm", "vllm_v1"), ("sglang", "sglang"))
_INTEGRATION = dict(PLUGIN_ENGINES)


class MixError(ValueError):
    """An ``--engines`` value that cannot be used; the message says why."""


@dataclass(frozen=True)
class ServerKind:
    """One kind of simulated server."""

    name: str
    #: The engine it runs; None for ``plugin``, whose servers alternate between vLLM and SGLang.
    engine: str | None
    #: Serves specobs's exposition (the plugin is loaded).
    plugin: bool
    #: Serves the engine's own exposition (its spec-decode counters and request gauges).
    engine_series: bool

    @property
    def source(self) -> str:
        """Where the rules' fleet series of such a server come from: ``plugin`` (specobs's
        series win on its host) or ``engine`` (its engine's own series only)."""
        return "plugin" if self.plugin else "engine"

    def integration(self, engine: str) -> str:
        """What ``specobs_info{integration}`` says for a plugin server on ``engine``."""
        return _INTEGRATION[engine]


def kinds() -> dict[str, ServerKind]:
    """Every kind ``--engines`` accepts, by the name it is written with."""
    out = {"plugin": ServerKind("plugin", None, plugin=True, engine_series=False)}
    for engine, _ in PLUGIN_ENGINES:
        name = f"{engine}+plugin"
        out[name] = ServerKind(name, engine, plugin=True, engine_series=True)
    for e in _engines.ENGINES:
        out[e.name] = ServerKind(e.name, e.name, plugin=False, engine_series=True)
    return out


#: The default fleet: every server with the plugin.
DEFAULT_MIX: tuple[tuple[ServerKind, float], ...] = ((kinds()["plugin"], 1.0),)


def parse_mix(text: str) -> tuple[tuple[ServerKind, float], ...]:
    """``"vllm:2,sglang,plugin"`` -> the kinds with their weights, in the order given."""
    known = kinds()
    out: list[tuple[ServerKind, float]] = []
    for item in text.split(","):
        name, sep, weight_text = item.strip().partition(":")
        name = name.strip()
        if name not in known:
            hint = ""
            engine = name.removesuffix("+plugin")
            if name.endswith("+plugin") and engine in known:
                hint = (f" (the simulated plugin runs in "
                        f"{' or '.join(e for e, _ in PLUGIN_ENGINES)}; {engine} is served "
                        f"engine-only as {engine!r})")
            raise MixError(f"--engines: unknown server kind {name!r} in {text!r}{hint}; expected "
                           f"KIND or KIND:WEIGHT with KIND one of {', '.join(known)}")
        if any(k.name == name for k, _ in out):
            raise MixError(f"--engines: {name!r} is given twice in {text!r}")
        weight = 1.0
        if sep:
            try:
                weight = float(weight_text)
            except ValueError:
                raise MixError(f"--engines: the weight of {name} must be a number, got "
                               f"{weight_text!r}") from None
            if not weight > 0 or weight == float("inf"):
                raise MixError(f"--engines: the weight of {name} must be > 0, got "
                               f"{weight_text!r}")
        out.append((known[name], weight))
    return tuple(out)


def layout(n_servers: int, mix: tuple[tuple[ServerKind, float], ...]
           ) -> list[tuple[ServerKind, int]]:
    """Each server's kind and its index in its kind's block, servers shared out by weight
    (largest remainder: the counts sum to ``n_servers`` and each is within one of its share)."""
    total = sum(w for _, w in mix)
    shares = [n_servers * w / total for _, w in mix]
    counts = [int(s) for s in shares]
    by_remainder = sorted(range(len(mix)), key=lambda i: (counts[i] - shares[i], i))
    for i in by_remainder[: n_servers - sum(counts)]:
        counts[i] += 1
    return [(kind, j) for (kind, _), count in zip(mix, counts, strict=True)
            for j in range(count)]


def describe_layout(servers: list[tuple[ServerKind, int]]) -> str:
    """``"0-2 vllm, 3-5 sglang, 6-9 plugin"``: the server indexes of each kind's block."""
    parts = []
    start = 0
    for i in range(1, len(servers) + 1):
        if i == len(servers) or servers[i][0] != servers[start][0]:
            span = f"{start}" if i - 1 == start else f"{start}-{i - 1}"
            parts.append(f"{span} {servers[start][0].name}")
            start = i
    return ", ".join(parts)
