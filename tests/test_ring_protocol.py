"""What the resolver needs of a ring (specobs/_ring_protocol.py): both rings have it, only the
native one pumps."""

from __future__ import annotations

from typing import Any

import pytest

from specobs import _ring, catalog
from specobs._recorder import NULL_CYCLE, _QuietSlow
from specobs._ring_protocol import PumpingRing, RingProtocol


def make(ring_type: Any) -> Any:
    return ring_type(_QuietSlow(), ("draft", "verify"), 64, 8, 1 << 20,
                     catalog.DURATION_BUCKETS_SECONDS, catalog.BATCH_SIZE_BUCKETS, NULL_CYCLE)


def test_the_python_ring_specifies_what_the_resolver_reads_and_does_not_pump():
    ring = make(_ring.PyRing)
    assert isinstance(ring, RingProtocol)
    assert not isinstance(ring, PumpingRing)
    # A ring that never walks without the GIL reads zeros where the native one times walks.
    assert (ring.nogil_ns, ring.walk_count, ring.walk_cpu_out, ring.walk_hold_ns) == (0, 0, 0, 0)


@pytest.mark.skipif(not _ring.BUILT, reason="the native core is not built")
def test_the_native_ring_has_all_of_it_and_the_pump():
    ring = make(_ring.NativeRing)
    assert isinstance(ring, RingProtocol)
    assert isinstance(ring, PumpingRing)
    assert ring.pumping == 0


def test_an_object_missing_a_call_is_no_ring():
    class Partial:
        settle_backlog = nogil_ns = walk_cpu_out = walk_cpu_in = walk_hold_ns = walk_count = 0

        def __len__(self) -> int:
            return 0

    assert not isinstance(Partial(), RingProtocol)
