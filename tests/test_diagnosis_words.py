"""The findings' words: every template belongs to a known code, renders from a finding's data,
and a finding carries the thresholds that decide its code."""

from __future__ import annotations

import string

import pytest

from specobs.tools import _diagnosis as dg
from specobs.tools._breakdown import breakdown
from specobs.tools._diagnosis import _thresholds, _words
from specobs.tools._scrape import Delta, Series


def _code(key: str) -> str:
    base = key.partition("/")[0]
    return "SPEC-RECENT-" + base.removeprefix("PAST-") if base.startswith("PAST-") \
        else "SPEC-" + base


def test_every_template_is_of_a_known_code_and_every_field_has_a_source() -> None:
    for key, (sentence, advice) in _words.TEXTS.items():
        code = _code(key)
        assert code in dg.CODES, key
        for template in (sentence, advice):
            for _, field, _, _ in string.Formatter().parse(template):
                if field is None or field in _words.FRAGMENTS:
                    continue
                # Anything else comes from the evidence, the facts or the code's thresholds:
                # a threshold named in a template must decide that code.
                if field.isupper():
                    assert field in _thresholds.used_by(code), (key, field)


def test_the_thresholds_a_template_names_are_the_ones_used() -> None:
    f = dg.cycle_bound(breakdown(Delta(Series(), Series(), 1.0)))
    assert f.code == "SPEC-CYCLE-UNKNOWN"
    assert f.sentence == "fewer than 10 cycles on either clock: no phase shares to read"
    assert f.thresholds == {"MIN_CLOCK_CYCLES": 10.0}


def test_the_specs_format_missing_values_as_the_sentences_always_did() -> None:
    assert _words.pct(None) == "-" and _words.pct(0.456) == "46%"
    assert _words.ms(0.0015) == "1.50 ms" and _words.ms(2.0) == "2.00 s"
    assert _words.x(1.234) == "1.23x" and _words.n(None) == "0"
    f = _words.found("SPEC-STALL", "fail",
                     {"seconds": 12.0, "requests_running": 3.0, "requests_waiting": None,
                      "last_cycle_age_seconds": None})
    assert f.sentence == ("decoding is stalled: 3 requests running and 0 waiting, and no cycle "
                          "in 12.0 s; no cycle yet")
    assert f.advice.startswith("the engine's step loop is hung")


def test_a_code_without_words_is_an_error_not_an_empty_sentence() -> None:
    with pytest.raises(KeyError):
        _words.found("SPEC-NO-SUCH-CODE", "info", {})
    with pytest.raises(KeyError):  # a value the template needs and nobody gave
        _words.found("SPEC-IDLE", "info", {})
