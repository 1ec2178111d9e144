"""The configuration reference (``specobs._config_reference``, rendered into
docs/configuration.md): every ``SPECOBS_*`` name the package reads is in it, every name in it is
one the package reads, and its defaults and bounds are the ones the code applies."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import specobs
from specobs import _config, _config_reference
from specobs._config_reference import SETTING_TEXTS, VARIABLES, documented_variables, entries
from specobs.mixin import _config_doc

PACKAGE = Path(specobs.__file__).parent
ROOT = PACKAGE.parent
NAME = re.compile(r"\bSPECOBS_[A-Z0-9_]+\b")
#: A variable read by the C code (none today; a getenv there must be documented too).
C_GETENV = re.compile(r"getenv\(\s*\"(SPECOBS_[A-Z0-9_]+)\"")


def names_in_source(package: Path) -> dict[str, list[str]]:
    """Every ``SPECOBS_*`` name in the package's Python source (code, docstrings and messages:
    a name a user is told to set is one the package reads) and every one the C code passes to
    ``getenv``, each with where it was found (``path:line``). C macros such as header guards
    are not variables and are not read."""
    found: dict[str, list[str]] = {}
    for path in sorted(package.rglob("*")):
        if path.suffix == ".py":
            pattern = NAME
        elif path.suffix in (".c", ".h"):
            pattern = C_GETENV
        else:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in pattern.finditer(line):
                name = match.group(1) if pattern.groups else match.group(0)
                found.setdefault(name, []).append(f"{path.relative_to(package.parent)}:{number}")
    return found


def undocumented(package: Path) -> list[str]:
    """One line per name the package reads that the reference does not list."""
    documented = documented_variables()
    return [f"{name} (read at {', '.join(places[:3])}) is not in specobs/_config_reference.py"
            for name, places in sorted(names_in_source(package).items())
            if name not in documented]


def test_every_specobs_variable_the_package_reads_is_documented():
    assert undocumented(PACKAGE) == []
    # The scan found the package's variables, not nothing.
    assert {"SPECOBS_QUEUE_SIZE", "SPECOBS_CORE", "SPECOBS_VLLM"} <= set(names_in_source(PACKAGE))


def test_a_new_variable_without_an_entry_fails_by_name(tmp_path: Path):
    """The check the package passes fails on a copy with one more variable read, naming it and
    where it is read; a C macro (not a variable) and a C getenv (one) are told apart."""
    copy = tmp_path / "specobs"
    (copy / "sinks").mkdir(parents=True)
    (copy / "sinks" / "extra.py").write_text(
        "import os\n\nLIMIT = os.environ.get('SPECOBS_SCRAPE_LIMIT', '10')\n")
    (copy / "_core.c").write_text(
        "#define SPECOBS_CORE_GUARD 1\nconst char *v = getenv(\"SPECOBS_NATIVE_TRACE\");\n")
    (copy / "_config.py").write_text("SPECOBS_QUEUE_SIZE = 'SPECOBS_QUEUE_SIZE'\n")
    assert undocumented(copy) == [
        "SPECOBS_NATIVE_TRACE (read at specobs/_core.c:2) is not in "
        "specobs/_config_reference.py",
        "SPECOBS_SCRAPE_LIMIT (read at specobs/sinks/extra.py:3) is not in "
        "specobs/_config_reference.py",
    ]


def test_every_documented_variable_is_read_somewhere_else():
    """A name only the reference holds (a typo, or a variable removed from the code) fails."""
    reference = Path(_config_reference.__file__).resolve()
    read = {name for name, places in names_in_source(PACKAGE).items()
            if any(not (ROOT / p.rsplit(":", 1)[0]).resolve() == reference for p in places)}
    assert sorted(documented_variables() - read) == []


def test_the_committed_page_has_a_section_for_every_entry():
    """docs/configuration.md as committed (``specobs generate --check`` keeps it equal to the
    rendering) has a heading per variable and per argument-only setting."""
    page = (ROOT / _config_doc.PATH).read_text(encoding="utf-8")
    assert page == _config_doc.render()
    headings = set(re.findall(r"^### `([a-zA-Z0-9_]+)`", page, flags=re.M))
    expected = {e.variable or e.argument for e in entries()}
    assert headings == expected
    assert documented_variables() <= headings


def test_every_settings_field_has_its_words_and_a_missing_one_is_named(monkeypatch):
    fields = [f.name for f in dataclasses.fields(specobs.Settings)]
    assert sorted(SETTING_TEXTS) == sorted(fields)
    shorter = {k: v for k, v in SETTING_TEXTS.items() if k != "idle_gap_seconds"}
    monkeypatch.setattr(_config_reference, "SETTING_TEXTS", shorter)
    with pytest.raises(KeyError, match="'idle_gap_seconds' has no entry in SETTING_TEXTS"):
        entries()


def test_a_settings_default_as_documented_reads_back_as_the_default():
    """Each default printed in backticks, given as the variable's text, is what ``configure()``
    applies when nothing is set."""
    defaults = specobs.Settings()
    checked = 0
    for setting in _config.SETTINGS:
        entry = next(e for e in entries() if e.argument == setting.field)
        shown = re.fullmatch(r"`([^`]*)`", entry.default)
        if shown is None:  # words: no value to parse (unset, or from other variables)
            assert getattr(defaults, setting.field) in (None, {}) or setting.field == "rank"
            continue
        value = setting.parse(setting.variable or setting.field, shown.group(1), True)
        assert value == getattr(defaults, setting.field), setting.field
        checked += 1
    assert checked >= 15


def test_the_variables_outside_the_table_document_what_their_readers_default_to():
    by_name = {v.name: v for v in VARIABLES}

    def shown(name: str) -> str:
        match = re.fullmatch(r"`([^`]*)`", by_name[name].default)
        assert match is not None, by_name[name].default
        return match.group(1)

    assert _config.prometheus_port({}) == int(shown("SPECOBS_PROMETHEUS_PORT"))
    assert _config.prometheus_addr({}) == shown("SPECOBS_PROMETHEUS_ADDR")
    assert _config.otlp_fork_wait_seconds({}) == float(shown("SPECOBS_OTLP_FORK_WAIT_SECONDS"))
    assert _config.exit_timeout_seconds({}) == float(shown("SPECOBS_EXIT_TIMEOUT_SECONDS"))
    assert _config.exporters({}) == () and by_name["SPECOBS_EXPORTERS"].default.startswith("unset")


@pytest.mark.parametrize("setting", [s for s in _config.SETTINGS
                                     if s.parse.accepts.startswith("an integer")],
                         ids=lambda s: s.field)
def test_the_integer_bounds_in_words_are_the_ones_the_parser_enforces(setting):
    """The words come from the parser's own bounds: the stated ends pass, one beyond fails with
    a ConfigurationError naming the variable."""
    low, high = re.fullmatch(r"an integer (?:from|>=) ([\d,]+)(?: to ([\d,]+))?",
                             setting.parse.accepts).groups()
    name = setting.variable or setting.field
    lowest = int(low.replace(",", ""))
    assert setting.parse(name, str(lowest), True) == lowest
    with pytest.raises(specobs.ConfigurationError, match=name):
        setting.parse(name, str(lowest - 1), True)
    if high is not None:
        highest = int(high.replace(",", ""))
        assert setting.parse(name, str(highest), True) == highest
        with pytest.raises(specobs.ConfigurationError, match=name):
            setting.parse(name, str(highest + 1), True)
