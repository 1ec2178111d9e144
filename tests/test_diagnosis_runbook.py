"""The runbook names, for every alert, the ``specobs doctor`` command and the findings that
explain it; every code it names is one the diagnosis returns."""

from __future__ import annotations

import re

from specobs.mixin import MixinConfig
from specobs.mixin._runbook import doctor_entries, entries, render
from specobs.tools import _diagnosis as dg


def test_every_alert_says_which_doctor_command_explains_it() -> None:
    assert set(doctor_entries()) == set(entries())
    runbook = render(MixinConfig())
    sections = re.split(r"^## ", runbook, flags=re.M)[1:]
    alerts = [s for s in sections if s.startswith("Specobs")]
    assert len(alerts) == len(entries())
    for section in alerts:
        assert "**Explain with:** `specobs doctor --prometheus <prometheus URL> --instance " \
               "<instance>`" in section, section.splitlines()[0]
        assert "`specobs doctor http://<instance>/metrics --min-cycles" in section


def test_the_codes_named_are_the_diagnosis_codes() -> None:
    for name, (codes, what) in doctor_entries().items():
        assert what, name
        for code in codes:
            assert code in dg.CODES, (name, code)
    stalled, _ = doctor_entries()["DecodingStalled"]
    assert stalled == ("SPEC-STALL",)
