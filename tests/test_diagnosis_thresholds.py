"""The diagnosis's thresholds table: every entry documented, every code it names real, the doc
generated from it, and each classifier deciding with the table's values."""

from __future__ import annotations

import re
from pathlib import Path

from specobs.tools import _diagnosis as dg
from specobs.tools._diagnosis import _compare, _thresholds, _window

ROOT = Path(__file__).resolve().parent.parent


def test_every_threshold_has_a_unit_a_meaning_and_real_codes() -> None:
    assert len(_thresholds.THRESHOLDS) >= 37
    for name, t in _thresholds.THRESHOLDS.items():
        assert t.name == name
        assert t.unit and t.meaning, name
        assert t.codes, f"{name} decides no finding"
        unknown = [c for c in t.codes if c not in dg.CODES]
        assert not unknown, f"{name} names codes no classifier returns: {unknown}"


def test_each_module_constant_is_its_table_row() -> None:
    for name, t in _thresholds.THRESHOLDS.items():
        assert getattr(_thresholds, name) == t.value, name
    # The classifiers read the table itself, not copies that could drift.
    assert _window.th is _thresholds and _compare.th is _thresholds


def test_the_face_keeps_only_the_thresholds_other_tools_read() -> None:
    upper = {n for n in dg.__all__ if n.isupper()} & set(_thresholds.THRESHOLDS)
    assert upper == {"MIN_SPEEDUP_CYCLES", "BATCH_SAME_FACTOR", "MIN_PAST_CYCLES",
                     "MIN_RECENT_CYCLES"}


def test_used_by_names_the_thresholds_of_a_code() -> None:
    used = _thresholds.used_by("SPEC-ACCEPT-COLLAPSE")
    assert used["FIRST_POSITION_MIN"] == 0.6
    assert used["COLLAPSE_RECOVERY"] == 0.15
    assert "GAP_SKEW" not in used
    assert _thresholds.used_by("SPEC-NO-SUCH-CODE") == {}


def test_the_doc_holds_the_generated_table() -> None:
    text = (ROOT / _thresholds.DOC_PATH).read_text(encoding="utf-8")
    assert _thresholds.doc_region() in text
    rows = re.findall(r"^\| `([A-Z_]+)` \| ", _thresholds.doc_region(), re.M)
    assert rows == list(_thresholds.THRESHOLDS)


def test_generate_finds_and_rewrites_a_drifted_table(tmp_path: Path) -> None:
    from specobs.tools import _generate

    doc = tmp_path / _thresholds.DOC_PATH
    doc.parent.mkdir()
    good = (ROOT / _thresholds.DOC_PATH).read_text(encoding="utf-8")
    doc.write_text(good.replace("| `SLOWER_Z` | 4 |", "| `SLOWER_Z` | 5 |"), encoding="utf-8")
    assert _generate._regions(tmp_path, write=False) == [_thresholds.DOC_PATH]
    assert _generate._regions(tmp_path, write=True) == [_thresholds.DOC_PATH]
    assert doc.read_text(encoding="utf-8") == good
    assert _generate._regions(tmp_path, write=False) == []
