"""The pure-Python ring's slots: what one cycle's slot holds, its states, and how the worker's
values are stored in it (taken natively, or kept as objects for the resolver).

See :mod:`specobs._ring` for the ring as a whole; ``specobs/_core/`` keeps the same slot in C.
"""

from __future__ import annotations

from typing import Any

#: Most sequences one accept() stores in the slot; more are validated by the resolver.
NATIVE_MAX_SEQ = 65536
#: What one cycle's acceptance may carry until the recorder sets the settings' bounds
#: (``max_cycle_sequences``, ``max_queue_bytes``; their defaults).
MAX_CYCLE_SEQUENCES = 16384
MAX_QUEUE_BYTES = 64 << 20
NSPARES = 4
#: Recording threads whose last cycle the drain remembers for the gaps between cycles; a new
#: thread beyond them takes the place of the one whose last cycle ended first.
GAP_THREADS = 64
#: Gaps between a thread's cycles longer than this (ns) are idling, not observed: the default of
#: ``Settings.idle_gap_seconds``.
IDLE_GAP_NS = 1_000_000_000
MAX_BATCH = 1 << 31
MAX_PHASES = 16
_INT_FORMATS = frozenset("bBhHiIlLqQ")
_INT_ONLY = {int}
#: Slot states: reserved by begin() (open), ended and waiting (done), or not a cycle (void:
#: discarded, begun in graph capture, drained). The resolver drains done slots in order, passes
#: void ones and stops at an open one.
OPEN, DONE, VOID = 1, 2, 3
#: A fourth: ended by ``defer()``, its times final and its acceptance to come from
#: ``settle()`` (then done), or from nobody within the resolver's timeout (``expire``: done,
#: counted ``unsettled``, its tokens not counted). The drain stops at it as at an open one.
DEFERRED = 4
#: A handle's deferral: none, awaiting ``settle()``, settled, or nothing to settle (the cycle was
#: discarded or begun in graph capture: counted there).
NO_DEFER, AWAITING, SETTLED, NOTHING = 0, 1, 2, 3


class Slot:
    __slots__ = (
        "acc", "accsum", "ak", "batch", "batch_obj", "copy", "cost", "dk", "dk_obj", "draft",
        "emitted", "ev", "has_obj_acc", "idx", "k", "lens", "nseq", "pbytes", "state", "tid",
        "ts",
    )

    def __init__(self) -> None:
        self.ts: list[int] = []
        self.idx = 0
        #: The native id of the thread that began the cycle (its gap is to that thread's last).
        self.tid = 0
        self.cost = 0
        self.batch = -1
        self.accsum = 0
        self.k = 0
        self.nseq = -1
        self.lens: list[int] = []
        self.state = VOID
        self.ev: Any = None
        self.copy: Any = None
        self.acc: Any = None
        self.draft: Any = None
        self.emitted: Any = None
        self.batch_obj: Any = None
        self.has_obj_acc = False
        #: What ``acc``, ``draft`` and ``emitted`` are estimated to hold (:func:`payload_bytes`),
        #: counted in the ring's ``queued_bytes`` while the slot holds them.
        self.pbytes = 0
        #: ``begin``'s draft length: an int in 0..k_max (-1: none or not taken), or the object
        #: as given for the resolver (``dk_obj``); ``accept``'s, when an int in 0..k_max (-1).
        self.dk = -1
        self.dk_obj: Any = None
        self.ak = -1

    def cycle_k(self) -> int:
        """The cycle's draft length as the ring knows it (see :attr:`Detail.cycle_k`): begin's,
        else the native acceptance's own when ``accept`` named it, else none (-1), or -2 when
        only the resolver can say (begin's object, or acceptance kept as an object)."""
        if self.dk_obj is not None:
            return -2
        if self.dk >= 0:
            return self.dk
        if self.nseq >= 0:
            return self.ak
        return -2 if self.has_obj_acc else -1

    def clear_objs(self, grave: list[Any] | None = None) -> None:
        """Let go of the objects kept; into ``grave`` when given, so that nothing a caller
        passed is freed (and no ``__del__`` runs) until the walk that clears it is over."""
        if grave is not None:
            grave += (self.acc, self.draft, self.emitted, self.batch_obj, self.ev, self.copy,
                      self.dk_obj)
        self.acc = self.draft = self.emitted = self.batch_obj = self.dk_obj = None



def payload_bytes(o: Any) -> int:
    """What an object a slot keeps for the resolver is estimated to hold: a list or tuple 56
    bytes and 8 a value (its items are small ints, which Python caches), an int or ``None``
    nothing, anything else 64. Exact types only, as the native core tells them apart."""
    if o is None or type(o) is int:
        return 0
    if type(o) is list or type(o) is tuple:
        return 56 + 8 * len(o)
    return 64


def payload_len(o: Any) -> int:
    """The values of a list or tuple (exact types); -1 for anything else."""
    return len(o) if type(o) is list or type(o) is tuple else -1


def exact_int_in(o: Any, lo: int, hi: int) -> int | None:
    if type(o) is int and lo <= o <= hi:
        return o
    return None


def taken_or_kept(o: Any, most: int) -> tuple[int, Any]:
    """``o`` as the ring takes it, an exact int in 0..most, and None; else -1 and ``o`` itself,
    kept for the resolver to judge."""
    v = exact_int_in(o, 0, most)
    return (v, None) if v is not None else (-1, o)


def set_batch(s: Slot, b: Any) -> None:
    s.batch, s.batch_obj = taken_or_kept(b, MAX_BATCH)


def set_draft_length(s: Slot, k: Any, k_max: int) -> None:
    """``begin``'s draft length: taken when an exact int in 0..k_max, else kept for the
    resolver (a numpy / torch scalar, or a bad value it counts as ``bad_draft_length``)."""
    s.dk, s.dk_obj = taken_or_kept(k, k_max)


def store_lengths(s: Slot, seq: list[int] | tuple[int, ...], k: int, most: int) -> bool:
    """Store at most ``most`` exact ints in 0..k (checked with C-level builtins: no Python work
    per value)."""
    n = len(seq)
    if n > most:
        return False
    if n and (set(map(type, seq)) != _INT_ONLY or min(seq) < 0 or max(seq) > k):
        return False
    s.lens = list(seq)
    s.nseq = n
    s.k = k
    s.accsum = sum(seq)
    return True


def store_buffer(s: Slot, obj: Any, k: int, most: int) -> bool:
    if isinstance(obj, (bytes, bytearray)):
        return False
    try:
        view = memoryview(obj)
    except TypeError:
        return False
    try:
        fmt = view.format.lstrip("@=<")
        if (view.ndim != 1 or len(fmt) != 1 or fmt not in _INT_FORMATS
                or not view.contiguous or len(view) > most):
            return False
        values = view.tolist()
    finally:
        view.release()
    return store_lengths(s, values, k, most)

