/* What every file of the native core shares: the layout of a Ring, its slots and a Cycle
 * handle, the constants, the atomics the worker and a walk without the GIL share, the interned
 * strings, and the small helpers more than one file calls.
 *
 * Internal to the extension: everything declared here has hidden visibility, and what one file
 * defines for another carries the specobs_ prefix. The helpers below are static inline, so the
 * hot path (ring.c) and the walks (drain.c, pump.c) inline them as they did in one file.
 *
 * Every helper here runs with the GIL held, except the ones marked "no GIL": those a walk calls
 * with the GIL let go and the ring's lock held (reading numbers, never a reference count).
 */
#ifndef SPECOBS_CORE_H
#define SPECOBS_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <structmember.h>
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "../_bucket.h"

#pragma GCC visibility push(hidden)

#if !defined(__linux__)
#error "the native core reads CLOCK_MONOTONIC, which is perf_counter_ns only on Linux"
#endif
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the poll reads the sign of a copied count from its last byte (little-endian)"
#endif

#define MAX_PHASES 16
/* Most sequences one accept() stores natively; more go to the resolver's Python validation. */
#define NATIVE_MAX_SEQ 65536
/* What one cycle's acceptance may carry until the recorder sets the settings' bounds
 * (specobs._ring.MAX_CYCLE_SEQUENCES, MAX_QUEUE_BYTES). */
#define MAX_CYCLE_SEQUENCES 16384
#define MAX_QUEUE_BYTES (((int64_t)64) << 20)
#define MAX_BATCH (((int64_t)1) << 31)
#define MAX_BOUNDS 256
#define NSPARES 4
/* Recording threads whose last cycle the drain remembers for the gaps between cycles
 * (specobs/_ring.py: GAP_THREADS). */
#define GAP_THREADS 64
/* What an acceptance copy without its own event fills its pinned slot with first: every byte
 * 0xFF, so each element reads negative (-1) until the copy has written it. */
#define SENTINEL_BYTE 0xFF
/* tests/test_core_memory.py builds the core with this set to 1 (one slot short) to show that its
 * sanitizer run catches an overrun. */
#ifndef SPECOBS_CORE_FAULT_OVERRUN
#define SPECOBS_CORE_FAULT_OVERRUN 0
#endif

/* A slot is reserved by begin() (open), and becomes done when its cycle ends, or void when it
 * is discarded (misuse, an exception, CUDA graph capture). The resolver drains done slots in
 * order, passes void ones, and stops at an open one. */
#define SLOT_OPEN 1
#define SLOT_DONE 2
#define SLOT_VOID 3
/* Ended by defer(): times final, acceptance to come from settle() or the resolver's timeout
 * (expire); the drain stops at it as at an open slot. */
#define SLOT_DEFERRED 4
/* A handle's deferral (Cycle.settle_state): none, awaiting settle(), settled, nothing to settle
 * (discarded or begun in graph capture: counted there). */
#define DEFER_NONE 0
#define DEFER_AWAITING 1
#define DEFER_SETTLED 2
#define DEFER_NOTHING 3
/* Fewer waiting cycles than this are drained with the GIL held: letting go of it and taking it
 * back costs more than walking a few slots. */
#define NOGIL_MIN 16

/* Entries of a ring's cache of event handles (a power of two; filled to half at most). */
#define HANDLE_CACHE 8192

/* The pump: what wakes it (pump_flag), and how many references of each kind it parks at most
 * before it comes back for Python to hand them back (events to the clock's pool, copies to
 * their pinned pool, though the worker takes parked copies back itself first). */
#define PUMP_PASS 1
#define PUMP_RETURN 2
#define PUMP_YIELD 4 /* another walker waits for ``wk``: let go of it, and go on after */
#define PARK_CAP 512 /* the CUDA clock's 256 pinned buffers, twice */
/* Passes a copy may be first in line with its values not landed before the pump leaves it to the
 * resolver's poll (which asks the driver: what settles a copy whose values never land). */
#define PUMP_POLLS_BEFORE_PYTHON 4

/* A slot's state is the one field the worker and a drain walking without the GIL share: the
 * worker writes every other field of its cycle before it stores DONE (release), and the walk
 * reads them only after it loaded DONE (acquire). The head and the tail are read across the
 * same two threads likewise. */
#define STATE(s) __atomic_load_n(&(s)->state, __ATOMIC_ACQUIRE)
#define STATE_SET(s, v) __atomic_store_n(&(s)->state, (v), __ATOMIC_RELEASE)
#define LOAD64(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE64(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
/* ``waiting`` and ``nheld`` are moved by the worker with the GIL and by the pump without it. */
#define ADDN(p, d) __atomic_add_fetch((p), (d), __ATOMIC_RELAXED)
#define LOADN(p) __atomic_load_n((p), __ATOMIC_RELAXED)

/* Bumped in a forked child (pthread_atfork): a ring's lock may have been held by a thread the
 * child does not have; the ring makes a new one the first time it is locked there. */
extern uint64_t specobs_fork_gen;

/* A clock's reading in ns. No GIL. */
static inline int64_t
clock_ns(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* What the ring stamps with: CLOCK_MONOTONIC, time.perf_counter_ns on Linux. */
static inline int64_t
now_ns(void)
{
    return clock_ns(CLOCK_MONOTONIC);
}

typedef struct {
    int64_t ts[MAX_PHASES + 1];
    int64_t idx;     /* cycle index (Ring.begun when it began) */
    unsigned long tid; /* the native id of the thread that began it (its gap is to that
                        * thread's previous cycle) */
    int64_t cost;    /* worker ns spent recording this cycle's events */
    int64_t batch;   /* a valid batch size, or -1 */
    int64_t accsum;  /* sum of lens */
    int32_t nts;     /* stamps taken: the index of the phase to start next */
    int32_t k;       /* draft length of the native acceptance */
    int32_t nseq;    /* sequences of the native acceptance, -1 when there is none */
    int32_t lcap;
    uint8_t *lens;   /* native acceptance: accepted length per sequence */
    int state;       /* SLOT_OPEN, SLOT_DONE (ended, waiting) or SLOT_VOID (not a cycle) */
    PyObject *ev;    /* a sampled cycle's events (a list), or NULL */
    PyObject *copy;  /* a CUDA acceptance copy in flight, or NULL */
    PyObject *acc;   /* acceptance kept as an object for the resolver to validate */
    PyObject *draft; /* draft_length kept as an object (with acc) */
    PyObject *emitted;
    PyObject *batch_obj; /* a batch size that is not an int in 0..2**31 */
    /* begin()'s draft length: an int in 0..k_max (-1: none given, or kept in dk_obj, a value
     * that is not one, for the resolver); accept()'s when it named an int in 0..k_max (-1). */
    int32_t dk, ak;
    PyObject *dk_obj;
    int has_obj_acc; /* acc / copy hold this cycle's acceptance (accept() was called) */
    /* What acc, draft and emitted are estimated to hold (payload_bytes), counted in the
     * ring's queued_bytes while the slot holds them. */
    int64_t pbytes;
    /* A copy started by the native core: its pinned buffer, element size and length, and the
     * draft length its values are validated against (-1: not an int in 0..k_max, or an
     * ``emitted`` was given: the resolver validates in Python). A drain without the GIL reads
     * the copy from these, never from the object. */
    void *cptr;
    int32_t cisz, clen, ck;
    int32_t cfenced; /* the native copy recorded its slot's event (else: the sentinel only) */
    PyObject *cpool;  /* its pool (borrowed), which the pump parks it with for the worker */
    /* A sampled cycle's events as the runtime's handles (``cudaEvent_t``), read from the event
     * objects by the resolver with the GIL (``specobs_fill_handles``) so that the walk without it can
     * read their times: ``evn`` is how many (the phases + 1), 0 not read yet, -1 unusable. */
    int32_t evn;
    uint64_t evh[MAX_PHASES + 1];
} Slot;

struct Totals;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    struct Totals *totals; /* what drain_into has added up */
    int64_t drained;       /* cycles drain_into has taken */
    Py_ssize_t capacity;
    Py_ssize_t nslots; /* capacity + 1 */
    uint64_t head, tail;
    int nph;
    int k_max;
    PyObject *phases; /* tuple of str */
    Py_ssize_t wake_at;
    /* A deferred cycle with this many done cycles waiting behind it is handed on unsettled
     * without waiting out its timeout (specobs._ring.PyRing.settle_backlog). */
    Py_ssize_t settle_backlog;
    /* The bounds of what one cycle's acceptance may carry (specobs._ring.PyRing): sequences
     * per list, and the estimated bytes of the objects the waiting cycles keep for the
     * resolver (queued_bytes), past which a cycle's acceptance is refused (oversized). */
    Py_ssize_t max_seq;
    int64_t max_queue_bytes, queued_bytes;
    int enabled;
    int sampling;       /* a clock is active: sample one cycle in ``interval`` */
    int64_t interval;
    int64_t clock_try_at; /* -1: no clock to try */
    int64_t begun, enqueued, dropped_queue_full, discarded, copy_ns;
    int64_t excepted; /* cycles discarded because the engine raised inside ``with`` */
    int64_t deferred, unsettled; /* deferred cycles awaiting settle(); handed on unsettled */
    int64_t tick, fake_now; /* tests: a clock that advances by ``tick`` per read (0: real) */
    unsigned long writer;   /* the native id of the thread that began the last cycle (0: none) */
    /* The gaps between a thread's cycles (add_gap), kept by the walkers of the tail: the last
     * end stamp of up to GAP_THREADS recording threads, the index the next drained cycle has
     * when none was lost in between (-1: none drained yet), and the bound past which a gap is
     * idling, counted instead of observed. */
    unsigned long gap_tid[GAP_THREADS];
    int64_t gap_end[GAP_THREADS];
    int gap_n;
    int64_t gap_next;
    int64_t idle_gap_ns;
    /* CUDA acceptance copies started here, through the runtime's own functions (set by the
     * clock with ``set_native_copy``; NULL: every copy goes through ``copy_to_host``). */
    int (*nc_memcpy)(void *, const void *, size_t, int, void *);
    int (*nc_record)(void *, void *);
    int (*nc_lasterr)(void);
    PyObject *nc_pools;     /* dict: dtype -> list of free pinned slots */
    PyObject *nc_stream_fn; /* callable(device index) -> the current raw stream, as an int */
    long nc_device;
    Py_ssize_t nc_capacity, nc_low;
    /* One copy in ``nc_fence_every`` records its slot's event (a fence: the copies before it on
     * the stream are complete once it is); the others fill their slot with SENTINEL_BYTE first
     * and are read once the values landed or a later event on the stream completed. A copy on
     * another stream than the last, or with the pool low, always records its event. */
    Py_ssize_t nc_fence_every, nc_since_fence;
    void *nc_last_stream;
    int64_t nc_copies, nc_fences;
    /* The poll's memory (``Ring.poll``): the cycle whose copy it found first in flight by its
     * sentinel, and for how many polls running. */
    int64_t if_idx, if_polls;
    Py_ssize_t waiting; /* done slots not yet drained */
    Py_ssize_t nheld;   /* of those, the ones holding events or a copy (what the poll asks) */
    /* Held by a drain while it walks the ring without the GIL, and by whoever else moves the
     * tail or reads the running totals meanwhile (a full ring's begin(), clear_queue, totals);
     * those hold the GIL, the walk never takes it, so the order GIL -> lock cannot deadlock. */
    pthread_mutex_t mu;
    uint64_t mu_gen;
    int64_t nogil_cycles, nogil_walks, nogil_ns;
    /* Sampled cycles' GPU times read here, without Python (``set_native_events``): the
     * runtime's cudaEventElapsedTime and cudaGetLastError, and the one thread they are read on
     * (the resolver's, whose current device the clock set). How many cycles were read so, and
     * the worker's ns recording their events (what the sampler weighs). */
    int (*ne_elapsed)(float *, void *, void *);
    int (*ne_lasterr)(void);
    int (*ne_query)(void *); /* cudaEventQuery: the poll asks sampled cycles' events with it */
    uint64_t fill_pos; /* specobs_fill_handles has looked at every done slot before this position */
    /* The events' handles, by event object (the clock's pool is fixed, and a handle never
     * changes): open addressing on the object's address, the objects held (so an address is
     * never reused while it is a key), emptied when set_native_events is called again. */
    PyObject **hc_key;
    uint64_t *hc_val;
    Py_ssize_t hc_n;
    unsigned long ne_thread;
    int64_t ne_cycles, ne_cost;
    /* The last drain_into's walks, on the thread's CPU clock (what time.thread_time_ns reads):
     * when it first let go of the GIL, when it last took it back, the longest stretch it held
     * the GIL between two walks, how many walks (0: it held the GIL throughout). */
    int64_t walk_cpu_out, walk_cpu_in, walk_hold_ns, walk_count;
    /* The pump (Ring.pump): the resolver's thread inside one C call that waits for work, polls
     * and walks with the GIL let go, and comes back to Python only for what needs it. ``pm``
     * guards ``pump_flag`` (PUMP_PASS: walk now; PUMP_RETURN: come back), ``pc`` is what the
     * pump waits on; ``wk`` is held by the pump for its whole call and by every other walker of
     * the tail (drain, drain_into, poll, pending), taken with the GIL let go while it waits. All
     * three are made by pump_made, with the GIL, anew in a forked child. ``pumping``: a thread
     * is inside pump() (read with the GIL). What the pump walked, and the references it let go
     * of (parked until the next drain_into hands them back, with the GIL): */
    pthread_mutex_t pm, wk;
    pthread_cond_t pc;
    uint64_t pm_gen;
    int pump_flag, pumping;
    int wk_wanted; /* walkers waiting for ``wk`` (the pump lets go of it while any does) */
    int64_t pump_cycles, pump_total; /* not handed to a drain_into yet */
    int64_t pump_calls, pump_passes, pump_walked, pump_ns, pump_cpu_in;
    PyObject **pk_buf; /* PARK_CAP copies, then drafts, then event lists */
    PyObject **pk_cpool; /* each parked copy's pool (borrowed), for the worker (parked_copy) */
    Py_ssize_t pk_ncopies, pk_ndrafts, pk_nevents;
    Py_ssize_t park_events; /* event lists parked before the pump comes back (<= PARK_CAP) */
    Py_ssize_t park_copies; /* copies likewise: a quarter of the smallest pinned pool */
    PyObject *slow;
    PyObject *record_fn;
    PyObject *stream;
    PyObject *current; /* the open cycle's handle (owned), or NULL */
    /* The last closed handles, reused when nobody else holds them: a loop that rebinds its
     * variable holds the previous handle while it begins the next, so two alternate. */
    PyObject *spares[NSPARES];
    PyObject *null_cycle;
    PyObject *dropped; /* list of (events, copy) of dropped cycles, for the resolver to release */
    PyObject *copy_type; /* the clock's pinned-buffer copy type, read here directly (or None) */
    double dbounds[MAX_BOUNDS];
    int ndb;
    double bbounds[MAX_BOUNDS];
    int nbb;
} Ring;

typedef struct {
    PyObject_HEAD
    Ring *ring;
    int64_t index; /* what the caller sees: the cycle's index, -1 inside graph capture */
    int64_t seq;   /* the cycle's index, always: its slot holds it while the slot is its own */
    uint64_t pos;  /* the slot's position in the ring */
    int closed;
    int settle_state; /* DEFER_* */
} Cycle;

/* The ring's clock: CLOCK_MONOTONIC, or for tests a counter advancing ``tick`` per read (the
 * differential test feeds the same stream to both implementations and compares every ns). */
static inline int64_t
ring_now(Ring *r)
{
    if (__builtin_expect(r->tick != 0, 0))
        return r->fake_now += r->tick;
    return now_ns();
}

/* The ring's lock, made (anew in a forked child, whose lock a lost thread may hold) by
 * lock_made, always with the GIL held: by ring_lock, which everyone but the walk takes with the
 * GIL, and by drain_into before it lets go of the GIL for the walk, so one thread makes it
 * before anyone waits on it. */
static inline void
lock_made(Ring *r)
{
    /* mu_gen is 0 until the lock is first made (a new ring is zeroed), then the generation + 1 */
    uint64_t gen = __atomic_load_n(&specobs_fork_gen, __ATOMIC_RELAXED) + 1;
    if (r->mu_gen != gen) {
        pthread_mutex_init(&r->mu, NULL);
        r->mu_gen = gen;
    }
}

static inline void
ring_lock(Ring *r)
{
    lock_made(r);
    pthread_mutex_lock(&r->mu);
}

static inline void
ring_unlock(Ring *r)
{
    pthread_mutex_unlock(&r->mu);
}

/* The strings the core calls, reads and compares by, interned once by the module's init
 * (module.c): STR(name) is one. X(field, text) lists them: attribute and method names, the
 * recorder's slow paths, the pump's answers, the misuse messages. */
#define SPECOBS_STRINGS(X)                                                                    \
    X(misuse, "misuse") X(misuse_mark, "misuse_mark") X(misuse_end, "misuse_end")             \
    X(internal_error, "internal_error") X(queue_full, "queue_full") X(wake, "wake")          \
    X(sample, "sample") X(try_clock, "try_clock") X(copy_to_host, "copy_to_host")             \
    X(tolist, "tolist") X(is_cuda, "is_cuda") X(numel, "numel") X(accepted, "accepted")     \
    X(draft_length, "draft_length") X(batch_size, "batch_size") X(emitted, "emitted")         \
    X(event, "event") X(ptr, "ptr") X(itemsize, "itemsize") X(length, "length")               \
    X(fenced, "fenced") X(sentinel, "sentinel") X(free, "_free") X(dtype, "dtype")            \
    X(is_contiguous, "is_contiguous") X(get_device, "get_device") X(data_ptr, "data_ptr")     \
    X(handle, "handle") X(cuda_event, "cuda_event") X(copy_event_failed, "copy_event_failed") \
    X(landed, "landed") X(oversized, "oversized")                                             \
    X(pump_woken, "woken") X(pump_python, "python") X(pump_expire, "expire")                  \
    X(pump_parked, "parked") X(pump_counts, "counts") X(pump_writer, "writer")                \
    X(pump_tick, "tick")                                                                      \
    X(msg_begin_open, "begin() while the previous cycle was open; the open cycle was "        \
                      "discarded (an observer belongs to one engine thread: configure one "   \
                      "per thread)")                                                          \
    X(msg_end_twice, "end() on a cycle that already ended")                                   \
    X(msg_defer_twice, "defer() on a cycle that already ended")                               \
    X(msg_settle_twice, "settle() twice on one cycle")                                        \
    X(msg_settle_undeferred, "settle() on a cycle that was not deferred")                     \
    X(msg_settle_late, "settle() after the cycle's timeout (counted unsettled) or after it "  \
                       "was dropped")                                                         \
    X(msg_accept_closed, "accept() after the cycle ended")

#define SPECOBS_STRING_FIELD(field, text) PyObject *field;
typedef struct {
    SPECOBS_STRINGS(SPECOBS_STRING_FIELD)
} SpecobsStrings;
#undef SPECOBS_STRING_FIELD
extern SpecobsStrings specobs_strings;
#define STR(field) (specobs_strings.field)

/* While a drain (or a drop) walks the ring, the references it lets go of are parked here and
 * dropped only once the ring is consistent again: dropping a caller's object can run Python code
 * (a __del__), which can hand the GIL to another thread mid-walk -- the worker, which could then
 * move the tail under the walk. The garbage collector is off for the same span (a collection
 * runs finalizers too). */
extern PyObject *specobs_deferring;

static inline void
drop_ref(PyObject **p)
{
    PyObject *o = *p;
    if (o == NULL)
        return;
    *p = NULL;
    if (specobs_deferring != NULL) {
        if (PyList_Append(specobs_deferring, o) == 0) {
            Py_DECREF(o); /* the list holds it: nothing is freed now */
            return;
        }
        PyErr_Clear();
    }
    Py_DECREF(o);
}

typedef struct {
    PyObject *list;
    int gc_was;
    int outer; /* a deferral already open: this one does nothing */
} Deferral;

static inline void
defer_begin(Deferral *d)
{
    d->outer = specobs_deferring != NULL;
    if (d->outer)
        return;
    d->gc_was = PyGC_Disable();
    d->list = PyList_New(0);
    if (d->list == NULL)
        PyErr_Clear(); /* out of memory: references are dropped at once, as before */
    specobs_deferring = d->list;
}

/* Drop what was parked; may run Python code (the ring is consistent by now). */
static inline void
defer_end(Deferral *d)
{
    if (d->outer)
        return;
    specobs_deferring = NULL;
    if (d->gc_was)
        PyGC_Enable();
    Py_XDECREF(d->list);
}

/* The estimated bytes the slot's kept objects hold, and the ring's count of them. */
static inline void
slot_payload(Ring *r, Slot *s, int64_t bytes)
{
    r->queued_bytes += bytes - s->pbytes;
    s->pbytes = bytes;
}

static inline void
slot_clear_objs(Ring *r, Slot *s)
{
    slot_payload(r, s, 0);
    drop_ref(&s->acc);
    drop_ref(&s->draft);
    drop_ref(&s->emitted);
    drop_ref(&s->batch_obj);
    drop_ref(&s->dk_obj);
}

/* Hand events and a copy the worker no longer holds (either may be NULL) to the resolver, which
 * releases them to their pools. On an error they are lost to the pool; nothing else is. */
static inline void
hand_back(Ring *r, PyObject *ev, PyObject *copy)
{
    PyObject *t = PyTuple_Pack(2, ev ? ev : Py_None, copy ? copy : Py_None);
    if (t == NULL || PyList_Append(r->dropped, t) < 0)
        PyErr_Clear();
    Py_XDECREF(t);
}

/* Hand a dropped slot's events and copy to the resolver. */
static inline void
slot_drop_held(Ring *r, Slot *s)
{
    if (s->ev == NULL && s->copy == NULL)
        return;
    hand_back(r, s->ev, s->copy);
    drop_ref(&s->ev);
    drop_ref(&s->copy);
}

/* An exact int (not a bool, not a subclass) in lo..hi. */
static inline int
exact_int_in(PyObject *o, int64_t lo, int64_t hi, int64_t *out)
{
    if (!PyLong_CheckExact(o))
        return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    if (v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

/* The cycle's draft length as the ring knows it (specobs._ring.Detail.cycle_k): begin()'s,
 * else the native acceptance's own when accept() named it, else none (-1); -2 when only the
 * resolver can say (begin()'s value kept as an object, or acceptance kept as an object). */
static inline int32_t
slot_cycle_k(const Slot *s)
{
    if (s->dk_obj != NULL)
        return -2;
    if (s->dk >= 0)
        return s->dk;
    if (s->nseq >= 0)
        return s->ak;
    return s->has_obj_acc ? -2 : -1;
}

/* Room for ``n`` accepted lengths in the slot, grown by doubling and kept for the slot's next
 * cycles. The raw allocator, which needs no GIL: a walk without it grows the buffer too. -1
 * when out of memory, with no error set. No GIL. */
static inline int
lens_room(Slot *s, Py_ssize_t n)
{
    if (n <= s->lcap)
        return 0;
    Py_ssize_t cap = s->lcap ? s->lcap : 16;
    while (cap < n)
        cap *= 2;
    uint8_t *p = PyMem_RawRealloc(s->lens, (size_t)cap);
    if (p == NULL)
        return -1;
    s->lens = p;
    s->lcap = (int32_t)cap;
    return 0;
}

/* lens_room with the GIL: -1 with MemoryError set. */
static inline int
ensure_lens(Slot *s, Py_ssize_t n)
{
    if (lens_room(s, n) == 0)
        return 0;
    PyErr_NoMemory();
    return -1;
}

/* Whether a slot holds references, which only a holder of the GIL may let go of. No GIL. */
static inline int
slot_holds_refs(const Slot *s)
{
    return s->ev || s->copy || s->acc || s->draft || s->emitted || s->batch_obj || s->dk_obj;
}

static inline Slot *
slot_of(Cycle *c)
{
    Ring *r = c->ring;
    return &r->slots[c->pos % (uint64_t)r->nslots];
}

/* Whether the slot is still this cycle's and open: a callback into Python may let another
 * thread close this cycle (misuse: an observer is one thread's) while it runs. */
static inline int
owns(Cycle *c, Slot *s)
{
    return STATE(s) == SLOT_OPEN && s->idx == c->seq;
}

/* Close the open cycle's handle (``current``, not NULL): its slot, while the slot is still the
 * cycle's own (the caller lets go of it), else NULL. */
static inline Slot *
close_open_cycle(Ring *r)
{
    Cycle *c = (Cycle *)r->current;
    c->closed = 1;
    Slot *s = slot_of(c);
    return owns(c, s) ? s : NULL;
}

/* A pinned copy's address and element size, with its event handle or its length (whichever
 * pointer is not NULL): member slots of the clock's copy type, read with no Python code run.
 * 0, or -1 with the error set. */
static inline int
pinned_fields(PyObject *o, void **ptr, long *itemsize, void **handle, Py_ssize_t *length)
{
    PyObject *po = PyObject_GetAttr(o, STR(ptr));
    PyObject *io = po ? PyObject_GetAttr(o, STR(itemsize)) : NULL;
    PyObject *xo = io ? PyObject_GetAttr(o, handle != NULL ? STR(handle) : STR(length)) : NULL;
    int rc = -1;
    if (xo != NULL) {
        *ptr = PyLong_AsVoidPtr(po);
        *itemsize = PyLong_AsLong(io);
        if (handle != NULL)
            *handle = PyLong_AsVoidPtr(xo);
        else
            *length = PyLong_AsSsize_t(xo);
        rc = PyErr_Occurred() ? -1 : 0;
    }
    Py_XDECREF(po);
    Py_XDECREF(io);
    Py_XDECREF(xo);
    return rc;
}

/* Whether ``n`` elements of ``isz`` bytes at ``p`` were all written over the sentinel: accepted
 * counts are never negative; the sentinel, and an element a copy has not written whole, is (its
 * top byte still 0xFF), so the top byte of each element decides. No Python call. */
static inline int
bytes_landed(const char *p, size_t isz, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((signed char)p[isz * i + isz - 1] < 0)
            return 0;
    return 1;
}

/* Whether a copy's buffer cannot be read (no buffer, elements of neither 4 nor 8 bytes, a length
 * out of 0..2**20): 1 with a ValueError set, else 0. */
static inline int
bad_buffer(const void *ptr, long isz, Py_ssize_t n)
{
    if (ptr != NULL && (isz == 4 || isz == 8) && n >= 0 && n <= (1 << 20))
        return 0;
    PyErr_SetString(PyExc_ValueError, "a pinned copy with no buffer, or of a bad shape");
    return 1;
}

/* Element ``i`` of a buffer of 8- or 4-byte signed integers. */
static inline int64_t
element_at(const void *ptr, long isz, Py_ssize_t i)
{
    if (isz == 8) {
        int64_t v;
        memcpy(&v, (const char *)ptr + 8 * i, 8);
        return v;
    }
    int32_t x;
    memcpy(&x, (const char *)ptr + 4 * i, 4);
    return x;
}

/* The next cycle waiting to be drained from queue position ``*p`` on (void slots passed over),
 * or NULL at the head or at a slot still open: cycles drain in order. */
static inline Slot *
next_done(Ring *r, uint64_t *p)
{
    for (; *p != r->head; (*p)++) {
        Slot *s = &r->slots[*p % (uint64_t)r->nslots];
        if (STATE(s) != SLOT_VOID)
            return STATE(s) == SLOT_DONE ? s : NULL;
    }
    return NULL;
}

/* What a drain adds up: host histograms per phase and for the cycle, accepted lengths, draft
 * lengths, batch sizes, token totals. One per drain call (``drain``) or the ring's running
 * totals (``drain_into``, read by the aggregation's snapshot: ``totals``). */
typedef struct Totals {
    int64_t host[(MAX_PHASES + 1) * (MAX_BOUNDS + 1)];
    int64_t hsum[MAX_PHASES + 1];
    int64_t gpu[(MAX_PHASES + 1) * (MAX_BOUNDS + 1)]; /* sampled cycles read natively */
    int64_t gsum[MAX_PHASES + 1];
    int64_t lcounts[256];
    int64_t bcounts[MAX_BOUNDS + 1];
    int64_t kseq[256];
    int kseen[256];
    int64_t cycles, accepted, drafted, emitted, bsum, bn, last;
    /* By draft length: accepted tokens by each sequence's own (seen where kseen); cycles, the
     * host ns of each phase and emitted tokens by the cycle's (slot_cycle_k; seen where
     * kcycles > 0). */
    int64_t kacc[256];
    int64_t kcycles[256];
    int64_t kemitted[256];
    int64_t khost[256 * MAX_PHASES];
    int64_t kbatch[256]; /* batch sizes of the cycles placed by their k, where counted here */
    /* Gaps between a thread's cycles: host ns bucketed on the duration bounds, their sum, and
     * the idle ones (longer than Ring.idle_gap_ns) counted instead. */
    int64_t gap[MAX_BOUNDS + 1];
    int64_t gapsum, idle;
} Totals;

/* What every drained cycle adds to the totals, on both drains (with the GIL, and the walk
 * without it): its host times (returns the cycle's), its native acceptance, its batch size. */
static inline int64_t
add_host(Ring *r, Totals *t, const int64_t *ts)
{
    int nph = r->nph, nb = r->ndb + 1;
    for (int i = 0; i < nph; i++) {
        int64_t d = ts[i + 1] - ts[i];
        t->host[i * nb + bucket_of(r->dbounds, r->ndb, (double)d * 1e-9)]++;
        t->hsum[i] += d;
    }
    int64_t tot = ts[nph] - ts[0];
    t->host[nph * nb + bucket_of(r->dbounds, r->ndb, (double)tot * 1e-9)]++;
    t->hsum[nph] += tot;
    t->last = ts[nph];
    t->cycles++;
    return tot;
}

/* A sampled cycle's GPU phase times (``g``, their sum ``sum``), read natively. */
static inline void
add_gpu(Ring *r, Totals *t, const int64_t *g, int64_t sum)
{
    int nph = r->nph, nb = r->ndb + 1;
    for (int i = 0; i < nph; i++) {
        t->gpu[i * nb + bucket_of(r->dbounds, r->ndb, (double)g[i] * 1e-9)]++;
        t->gsum[i] += g[i];
    }
    t->gpu[nph * nb + bucket_of(r->dbounds, r->ndb, (double)sum * 1e-9)]++;
    t->gsum[nph] += sum;
}

static inline void
add_acceptance(Totals *t, const Slot *s)
{
    if (s->nseq < 0)
        return;
    /* A sequence that drafted nothing (k = 0) emits a token but is no draft: it has no accept
     * length. */
    const uint8_t *lens = s->lens;
    for (int32_t j = 0; s->k > 0 && j < s->nseq; j++)
        t->lcounts[lens[j]]++;
    t->accepted += s->accsum;
    t->drafted += (int64_t)s->k * s->nseq;
    t->emitted += s->accsum + s->nseq;
    t->kseq[s->k] += s->nseq;
    t->kseen[s->k] = 1;
    t->kacc[s->k] += s->accsum;
}

/* A cycle under its draft length, where the ring can tell it (after its acceptance was read):
 * the cycle, its host phase times, and its emitted tokens when its acceptance is native. */
static inline void
add_by_k(Ring *r, Totals *t, const Slot *s)
{
    int32_t k = slot_cycle_k(s);
    if (k < 0)
        return;
    t->kcycles[k]++;
    int64_t *h = &t->khost[k * MAX_PHASES];
    for (int i = 0; i < r->nph; i++)
        h[i] += s->ts[i + 1] - s->ts[i];
    if (s->nseq >= 0)
        t->kemitted[k] += s->accsum + s->nseq;
}

/* A cycle's batch size, where the ring counts it (not kept for the resolver to validate): into
 * the histogram, and under the cycle's draft length where it has one. */
static inline void
add_batch(Ring *r, Totals *t, const Slot *s)
{
    int64_t b = s->batch >= 0 ? s->batch : (s->nseq >= 0 ? s->nseq : -1);
    if (b >= 0) {
        t->bcounts[bucket_of(r->bbounds, r->nbb, (double)b)]++;
        t->bsum += b;
        t->bn++;
        int32_t k = slot_cycle_k(s);
        if (k >= 0)
            t->kbatch[k] += b;
    }
}

/* A drained cycle's gap: host ns from the end of the previous cycle its thread began to its own
 * begin (PyRing._gap is the specification). A thread's first cycle has none; a gap longer than
 * idle_gap_ns is counted as idle; a hole in the cycle indices (a cycle dropped or discarded,
 * which no drain sees) makes every thread start afresh, so no gap spans a lost cycle. Called in
 * drain order by the walkers of the tail only. */
static inline void
add_gap(Ring *r, Totals *t, const Slot *s)
{
    if (r->gap_next >= 0 && s->idx != r->gap_next)
        r->gap_n = 0;
    r->gap_next = s->idx + 1;
    int64_t end = s->ts[r->nph];
    int i = 0, oldest = 0;
    for (; i < r->gap_n && r->gap_tid[i] != s->tid; i++)
        if (r->gap_end[i] < r->gap_end[oldest])
            oldest = i;
    if (i == r->gap_n) { /* a thread not seen: no gap yet */
        if (r->gap_n < GAP_THREADS)
            r->gap_n++;
        else
            i = oldest; /* the thread whose last cycle ended first makes room */
        r->gap_tid[i] = s->tid;
        r->gap_end[i] = end;
        return;
    }
    int64_t g = s->ts[0] - r->gap_end[i];
    if (g < 0)
        g = 0;
    r->gap_end[i] = end;
    if (g > r->idle_gap_ns) {
        t->idle++;
        return;
    }
    t->gap[bucket_of(r->dbounds, r->ndb, (double)g * 1e-9)]++;
    t->gapsum += g;
}

/* Whether a done cycle is one the walk without the GIL can take, bound, traces and slowness
 * aside: nothing but numbers, or a native copy of the clock's pinned type to read, or events
 * whose handles it has and times it can read (``nev``: on this thread). */
static inline int
walkable(const Ring *r, const Slot *s, int nev)
{
    if (s->ev && !(nev && s->evn == r->nph + 1))
        return 0;
    if (s->acc || s->emitted || s->batch_obj || s->dk_obj)
        return 0;
    const void *copy_type = r->copy_type;
    if (s->copy == NULL)
        return !s->draft && !s->has_obj_acc;
    return s->cptr != NULL && s->ck >= 0 && s->nseq < 0 && s->clen <= NATIVE_MAX_SEQ
           && (s->cisz == 4 || s->cisz == 8) && (const void *)Py_TYPE(s->copy) == copy_type;
}

/* The calling thread's CPU time (what time.thread_time_ns reads). No GIL. */
static inline int64_t
thread_cpu_ns(void)
{
    return clock_ns(CLOCK_THREAD_CPUTIME_ID);
}

/* What the walk parks for the caller to hand back once it holds the GIL again: the copies it
 * read, their draft-length objects, the sampled cycles' event lists (references moved here). */
typedef struct {
    PyObject **copies, **drafts, **events;
    Py_ssize_t ncopies, ndrafts, nevents, nheld;
    PyObject **cpools; /* each copy's pool, when the pump parks (else NULL) */
} Parked;

/* The pump's parking as a Parked (its counts copied in; ``cpools``: where the walk notes each
 * copy's pool, NULL where nobody reads them back). */
static inline Parked
parking_of(Ring *r, PyObject **cpools)
{
    Parked pk = {r->pk_buf, r->pk_buf + PARK_CAP, r->pk_buf + 2 * PARK_CAP,
                 r->pk_ncopies, r->pk_ndrafts, r->pk_nevents, 0, cpools};
    return pk;
}

/* Whether entry ``i`` of the pump's parking holds a reference (the counts say how many of each
 * kind; entries past them are stale). */
static inline int
parked_at(const Ring *r, Py_ssize_t i)
{
    Py_ssize_t kind = i / PARK_CAP, j = i % PARK_CAP;
    return j < (kind == 0 ? r->pk_ncopies : kind == 1 ? r->pk_ndrafts : r->pk_nevents);
}

/* -- what one file defines for the others ------------------------------------------------- */

/* module.c */
extern PyTypeObject specobs_cycle_type;

/* ring.c: the worker's side (the hot path), and settle()'s clearing, which expire() shares */
PyObject *specobs_ring_begin(Ring *r, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames);
PyObject *specobs_cycle_mark(Cycle *self, PyObject *phase);
PyObject *specobs_cycle_accept(Cycle *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames);
PyObject *specobs_cycle_end(Cycle *self, PyObject *ignored);
PyObject *specobs_cycle_defer(Cycle *self, PyObject *ignored);
PyObject *specobs_cycle_settle(Cycle *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames);
PyObject *specobs_cycle_enter(PyObject *self, PyObject *ignored);
PyObject *specobs_cycle_exit(Cycle *self, PyObject *const *args, Py_ssize_t nargs);
void specobs_clear_acceptance(Ring *r, Slot *s);

/* events.c: the poll, GPU times through the runtime */
PyObject *specobs_ring_poll(Ring *r, PyObject *const *args, Py_ssize_t nargs);
int specobs_read_gpu(Ring *r, const Slot *s, int64_t *g, int64_t *sum);
PyObject *specobs_ring_set_native_events(Ring *r, PyObject *args);
PyObject *specobs_fake_event_fns(PyObject *m, PyObject *ignored);

/* copies.c: reading native copies, the handle cache */
int specobs_copy_back(PyObject *copy, PyObject *released);
int specobs_read_copy(Ring *r, Slot *s, PyObject *released);
PyObject *specobs_ring_set_native_copy(Ring *r, PyObject *args);
void specobs_fill_handles(Ring *r, Py_ssize_t limit);
void specobs_handles_forget(Ring *r);
void specobs_handles_cached(Ring *r, Slot *s);
PyObject *specobs_ring_cache_handles(Ring *r, PyObject *events);

/* drain.c: the drains with the GIL, the totals */
PyObject *specobs_ring_pending(Ring *r, PyObject *arg);
PyObject *specobs_ring_drain(Ring *r, PyObject *const *args, Py_ssize_t nargs);
PyObject *specobs_ring_drain_into(Ring *r, PyObject *const *args, Py_ssize_t nargs);
PyObject *specobs_ring_totals(Ring *r, PyObject *ignored);
PyObject *specobs_ring_reset_totals(Ring *r, PyObject *ignored);
PyObject *specobs_set_detail_type(PyObject *m, PyObject *cls);

/* pump.c: the walk without the GIL, the pump */
void specobs_pump_init(Ring *r, uint64_t gen);
void specobs_pump_signal(Ring *r, int flag);
void specobs_walker_take(Ring *r);
int specobs_unpark(Parked *pk, PyObject *released);
Py_ssize_t specobs_drain_nogil(Ring *r, long long bound, Py_ssize_t limit, PyObject *trace,
                               long long slow_ns, int nev, PyObject *released,
                               int64_t *total_out);
PyObject *specobs_ring_pump(Ring *r, PyObject *const *args, Py_ssize_t nargs);
PyObject *specobs_ring_pump_wake(Ring *r, PyObject *ignored);

/* The pump's locks and condition (see Ring), made with the GIL by specobs_pump_init, anew in a
 * forked child: no thread is inside pump() there. */
static inline void
pump_made(Ring *r)
{
    uint64_t gen = __atomic_load_n(&specobs_fork_gen, __ATOMIC_RELAXED) + 1;
    if (r->pm_gen != gen)
        specobs_pump_init(r, gen);
}

/* Whether a thread is inside pump(); with the GIL. */
static inline int
pump_active(Ring *r)
{
    pump_made(r);
    return r->pumping;
}

static inline void
walker_give(Ring *r)
{
    pthread_mutex_unlock(&r->wk);
}

#pragma GCC visibility pop

#endif /* SPECOBS_CORE_H */
