"""Every threshold the diagnosis decides with, in one table (:data:`THRESHOLDS`).

The table is ``thresholds.ini`` beside this module: each entry has its value, its unit, what it
bounds, and the codes of the findings it decides. The classifiers read the values by name
(``th.SLOWER_Z``, with ``from specobs.tools._diagnosis import _thresholds as th``).
``specobs generate`` renders the table into docs/diagnosis.md (:func:`doc_region`), and
``specobs generate --check`` fails when the doc drifts from it.
"""

from __future__ import annotations

import configparser
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BEGIN", "DOC_PATH", "END", "THRESHOLDS", "Threshold", "doc_region", "used_by"]


@dataclass(frozen=True)
class Threshold:
    """One row of the table."""

    name: str
    #: An int where the table writes one (a count of positions or batch sizes), else a float.
    value: float
    unit: str
    meaning: str
    #: The codes of the findings it decides.
    codes: tuple[str, ...]


def _load() -> dict[str, Threshold]:
    table = configparser.ConfigParser(interpolation=None, empty_lines_in_values=False)
    table.optionxform = str  # type: ignore[assignment,method-assign]
    table.read_string((Path(__file__).parent / "thresholds.ini").read_text(encoding="utf-8"))
    out = {}
    for name in table.sections():
        row = table[name]
        raw = row["value"]
        value = int(raw) if raw.isdigit() else float(raw)
        out[name] = Threshold(name, value, row["unit"], " ".join(row["meaning"].split()),
                              tuple(c.strip() for c in row["codes"].split(",")))
    return out


#: The table, in the order of docs/diagnosis.md's sections.
THRESHOLDS: dict[str, Threshold] = _load()


def __getattr__(name: str) -> float:
    """A threshold's value by its name: ``_thresholds.SLOWER_Z``."""
    try:
        return THRESHOLDS[name].value
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def used_by(code: str) -> dict[str, float]:
    """The thresholds that decide the finding ``code``: name -> value."""
    return {t.name: t.value for t in THRESHOLDS.values() if code in t.codes}


# -- the doc --------------------------------------------------------------------------------------

DOC_PATH = "docs/diagnosis.md"
BEGIN = ("<!-- BEGIN GENERATED: thresholds, from specobs/tools/_diagnosis/thresholds.ini "
         "(specobs generate; do not edit by hand) -->")
END = "<!-- END GENERATED: thresholds -->"


def doc_region() -> str:
    """The thresholds table of docs/diagnosis.md, markers included, ending with a newline."""
    lines = [BEGIN, "",
             "| threshold | value | unit | what it bounds | findings it decides |",
             "| --- | --- | --- | --- | --- |"]
    for t in THRESHOLDS.values():
        codes = ", ".join(f"`{c}`" for c in t.codes)
        lines.append(f"| `{t.name}` | {t.value:g} | {t.unit} | {t.meaning} | {codes} |")
    lines += ["", END]
    return "\n".join(lines) + "\n"
