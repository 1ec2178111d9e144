"""The exposition bytes prometheus_client writes for our families, written faster.

prometheus_client's encoders escape every label name and value of every sample on every scrape;
with ~330 series that is most of a 2 ms render, all of it holding the GIL. Our series' names and
label sets do not change between scrapes, so each sample's prefix (name and labels), each
family's header and each exemplar suffix is rendered once -- by prometheus_client's own encoder,
on a one-sample copy of the family, so the bytes are its bytes for whatever version and format
it chose -- and cached; a scrape formats only the values (``floatToGoString``, as it does).
``tests/test_prometheus_sink.py`` compares both encoders' output byte for byte.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.utils import floatToGoString as _float_to_go_string

__all__ = ["CachedExposition"]

#: Samples whose name is the family's plus one of these go, in the text format, into a gauge
#: family of their own after the family (prometheus_client's rule).
_TEXT_SUFFIXES = ("_created", "_gsum", "_gcount")
#: Entries kept per cache before it is emptied (labels are bounded, but an info label or a
#: user's label value may change over a process's life).
_MAX_ENTRIES = 8192
#: How prometheus_client formats a value (both formats use it).
floatToGoString: Callable[[Any], str] = _float_to_go_string


class _Families:
    """A registry stand-in that yields the given families (what an encoder iterates)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


class CachedExposition:
    """Encodes families as ``encoder`` would, caching everything but the values."""

    def __init__(self) -> None:
        self._prefix: dict[tuple[Any, ...], str] = {}
        self._header: dict[tuple[Any, ...], str] = {}
        self._exemplar: dict[tuple[Any, ...], str] = {}

    def encode(
        self, families: Iterable[Metric], encoder: Callable[[Any], bytes], ctype: str
    ) -> bytes:
        """The exposition of ``families`` in the format of ``encoder`` (content type ``ctype``).

        Raises ValueError for a sample this encoder does not handle (a timestamp, a native
        histogram, a missing value): the caller then uses ``encoder`` itself.
        """
        if len(self._prefix) + len(self._header) + len(self._exemplar) > _MAX_ENTRIES:
            self._prefix.clear()
            self._header.clear()
            self._exemplar.clear()
        om = ctype.startswith("application/openmetrics-text")
        prefixes = self._prefix
        out: list[str] = []
        for m in families:
            out.append(self._head(encoder, ctype, m, ""))
            grouped: dict[str, list[str]] = {}
            for s in m.samples:
                if s.timestamp is not None or s.value is None or getattr(
                    s, "native_histogram", None
                ):
                    raise ValueError(f"sample {s.name} needs the library encoder")
                key = (ctype, s.name, tuple(s.labels.items()))
                prefix = prefixes.get(key)
                if prefix is None:
                    prefix = self._render_prefix(encoder, m, s, om)
                    prefixes[key] = prefix
                line = prefix + floatToGoString(s.value)
                if om and s.exemplar is not None:
                    line += self._exemplar_suffix(encoder, ctype, m, s, prefix, om)
                line += "\n"
                if not om:
                    for suffix in _TEXT_SUFFIXES:
                        if s.name == m.name + suffix:
                            grouped.setdefault(suffix, []).append(line)
                            break
                    else:
                        out.append(line)
                else:
                    out.append(line)
            for suffix, lines in sorted(grouped.items()):
                out.append(self._head(encoder, ctype, m, suffix))
                out.extend(lines)
        if om:
            out.append("# EOF\n")
        return "".join(out).encode("utf-8")

    # -- what the library renders once ------------------------------------------------------------
    @staticmethod
    def _one(encoder: Callable[[Any], bytes], m: Metric, samples: list[Any]) -> list[str]:
        f = copy.copy(m)
        f.samples = samples
        return encoder(_Families([f])).decode("utf-8").splitlines(keepends=True)

    def _head(self, encoder: Callable[[Any], bytes], ctype: str, m: Metric, suffix: str) -> str:
        key = (ctype, m.name, m.type, m.documentation, m.unit, suffix)
        head = self._header.get(key)
        if head is None:
            if not suffix:
                lines = self._one(encoder, m, [])
                head = "".join(x for x in lines if x != "# EOF\n")
            else:  # the text format's own family for _created and the like: its two lines
                sample = _sample(m.name + suffix, {}, 0.0)
                lines = self._one(encoder, m, [sample])
                head = "".join(lines[-3:-1])
            self._header[key] = head
        return head

    def _render_prefix(self, encoder: Callable[[Any], bytes], m: Metric, s: Any,
                       om: bool) -> str:
        lines = self._one(encoder, m, [s._replace(exemplar=None)])
        line = lines[-2] if om else lines[-1]  # OpenMetrics ends with "# EOF"
        value = floatToGoString(s.value)
        if not line.endswith(" " + value + "\n"):
            raise ValueError(f"unexpected sample line {line!r}")
        return line[: len(line) - len(value) - 1]

    def _exemplar_suffix(self, encoder: Callable[[Any], bytes], ctype: str, m: Metric, s: Any,
                         prefix: str, om: bool) -> str:
        ex = s.exemplar
        key = (ctype, m.type, s.name, tuple(sorted(ex.labels.items())), ex.value, ex.timestamp)
        suffix = self._exemplar.get(key)
        if suffix is None:
            lines = self._one(encoder, m, [s])
            line = lines[-2] if om else lines[-1]
            head = prefix + floatToGoString(s.value)
            if not line.startswith(head):
                raise ValueError(f"unexpected exemplar line {line!r}")
            suffix = line[len(head):-1]
            self._exemplar[key] = suffix
        return suffix


def _sample(name: str, labels: dict[str, str], value: float) -> Any:
    from prometheus_client.samples import Sample

    return Sample(name, labels, value)
