"""What only the native ring has: the pump, native copies and the handle cache.

specobs/_ring.py specifies every other name of the native ring's surface; these three parts
exist to work without the GIL or without Python code, which pure Python cannot do.
docs/architecture.md ("What is C-only, and why") names each of them and says why.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specobs import _ring

pytestmark = pytest.mark.skipif(not _ring.BUILT, reason="the native core is not built here")

ARCHITECTURE = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"

#: The pump, the native copies' start and the handle cache, by the names the ring shows.
C_ONLY = {
    "pump", "pump_wake", "pumping", "pump_calls", "pump_passes", "pump_walked", "pump_ns",
    "pump_cpu_in", "park_copies", "park_events",
    "set_native_copy", "native_copies", "native_fences", "fence_every",
    "cache_handles",
}


def _public(obj: object) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def _rings() -> tuple[object, object]:
    args = (object(), ("draft", "verify"), 8, 4, 2, [0.001, 0.01], [1.0, 8.0], None)
    return _ring.NativeRing(*args), _ring.PyRing(*args)


def test_the_native_ring_has_no_name_its_twin_lacks_but_the_c_only_ones() -> None:
    native, twin = _rings()
    assert _public(native) - _public(twin) == C_ONLY


def test_the_architecture_doc_names_every_c_only_name() -> None:
    text = ARCHITECTURE.read_text()
    section = text[text.index("**What is C-only, and why.**"):]
    section = section[: section.index("\n\n", section.index("Everything else"))]
    named = set(re.findall(r"`(\w+)`", section))
    assert C_ONLY <= named, sorted(C_ONLY - named)
