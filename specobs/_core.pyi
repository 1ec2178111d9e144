"""Types of the native core (``specobs/_core.c``).

Its ``Ring`` is ``specobs._ring.PyRing`` in C: the same constructor, methods and attributes,
typed and documented there once (``tests/test_ring.py`` runs both on the same streams and checks
that the native ring has no other public name than those below). The ring in use is picked, and
typed ``Any``, in ``specobs._ring``; what only the native ring has is declared here.
"""

from typing import Any

from specobs._model import CycleHandle

def now_ns() -> int: ...
def set_detail_type(cls: type[tuple[Any, ...]]) -> None: ...
def _fake_event_fns() -> tuple[int, int, int]: ...

#: The handle ``Ring.begin`` returns: a :class:`specobs._model.CycleHandle`.
Cycle: type[CycleHandle]

class Ring:
    def __init__(self, *args: Any) -> None: ...
    def __len__(self) -> int: ...
    def __getattr__(self, name: str) -> Any: ...  # PyRing's
    # Native only: the acceptance copies started in C (``set_native_copy``).
    fence_every: int
    @property
    def native_copies(self) -> int: ...
    @property
    def native_fences(self) -> int: ...
    def set_native_copy(
        self,
        memcpy: int = 0,
        record: int = 0,
        get_last_error: int = 0,
        stream_fn: Any = None,
        device: int = 0,
        pools: Any = None,
        capacity: int = 0,
        low: int = 0,
        fence_every: int = 1,
    ) -> None: ...
    # Native only: the pump, the resolver's steady state with the GIL let go (``Ring.pump``).
    def pump(
        self, poll_ns: int, next_trace: int, slow_ns: int, settle_ns: int, return_after_ns: int
    ) -> str: ...
    def pump_wake(self) -> None: ...
    # read-only counters of the pump (see docs/architecture.md)
    pump_calls: int
    pump_passes: int
    pump_walked: int
    pump_ns: int
    pump_cpu_in: int
    pumping: int
    park_events: int
    park_copies: int
    def cache_handles(self, events: Any) -> int: ...
