"""Clocks: the host clock on every boundary, CUDA events on sampled cycles, and a fake for tests.

An *event clock* gives the recorder a pool of pre-created events and a ``record_fn(event,
stream)`` it can call with no lookups, and gives the resolver ``query`` and ``elapsed_ns``. Only
:mod:`specobs.timing.cuda` imports torch, and only when a CUDA clock is actually created.
"""

from specobs.timing._base import EventClock, PendingCopy
from specobs.timing.fake import FakeDeviceArray, FakeEventClock, FakeGpu, FakeNativeCopyClock
from specobs.timing.host import WallAnchor

__all__ = [
    "EventClock",
    "FakeDeviceArray",
    "FakeEventClock",
    "FakeGpu",
    "FakeNativeCopyClock",
    "PendingCopy",
    "WallAnchor",
]
