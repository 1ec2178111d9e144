/* The native hot path: a ring of preallocated cycle slots, written by C methods on the
 * inference worker's thread, and drained in chunks by the resolver.
 *
 * specobs/_ring.py is the specification: the same Ring and Cycle in pure Python, used where
 * this module is not built. tests/test_ring.py runs random cycle streams (every accept input,
 * misuse, drops, fork) through both and requires identical chunks and counters.
 *
 * The worker's calls (Ring.begin, Cycle.mark / accept / end, the context manager) read
 * CLOCK_MONOTONIC (what time.perf_counter_ns reads on Linux) and write integers into the open
 * cycle's slot: no Python object is created or touched per cycle in the common case. What is not
 * common goes to the recorder (``slow``, specobs._recorder.Recorder) as a Python call: misuse
 * (counted and logged there), a sampled cycle's CUDA events, a CUDA acceptance copy, a value
 * this module does not validate itself (kept as the object, validated by the resolver).
 *
 * Slots: ``capacity`` published cycles (``[tail, head)``) plus the open one (``head``), so the
 * open cycle never writes into a cycle still waiting for the resolver. A full ring drops its
 * oldest cycle when the next one ends (counted as queue_full), so memory is bounded whatever
 * happens downstream.
 *
 * The GIL protects everything here: the worker and the resolver both call in with it held, and
 * nothing below releases it between reading and writing the ring (callbacks into Python happen
 * only on the worker's side, and the resolver's drain makes none).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <structmember.h>
#include <stdint.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "_bucket.h"

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
static uint64_t g_fork_gen = 0;

static inline int64_t
now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
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
     * objects by the resolver with the GIL (``fill_handles``) so that the walk without it can
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
    uint64_t fill_pos; /* fill_handles has looked at every done slot before this position */
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

static PyTypeObject RingType;
static PyTypeObject CycleType;
static void fill_handles(Ring *r, Py_ssize_t limit);
static void hand_on(Ring *r, Slot *s);
static void handles_forget(Ring *r);

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
    uint64_t gen = __atomic_load_n(&g_fork_gen, __ATOMIC_RELAXED) + 1;
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

/* The pump's locks and condition (see Ring), made with the GIL, anew in a forked child: no
 * thread is inside pump() there. ``wk`` is recursive: Python code a walker runs (a clock's query)
 * may call another walker on the same thread. */
static void
pump_made(Ring *r)
{
    uint64_t gen = __atomic_load_n(&g_fork_gen, __ATOMIC_RELAXED) + 1;
    if (r->pm_gen == gen)
        return;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->pc, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&r->wk, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_mutex_init(&r->pm, NULL);
    r->pump_flag = 0;
    r->pumping = 0;
    r->wk_wanted = 0;
    r->pm_gen = gen;
}

/* Whether a thread is inside pump(); with the GIL. */
static inline int
pump_active(Ring *r)
{
    pump_made(r);
    return r->pumping;
}

/* Wake the pump (PUMP_PASS: walk now; PUMP_RETURN: come back to Python). A flag set while no
 * thread pumps is kept for the next pump() call. */
static void
pump_signal(Ring *r, int flag)
{
    pump_made(r);
    pthread_mutex_lock(&r->pm);
    r->pump_flag |= flag;
    pthread_cond_signal(&r->pc);
    pthread_mutex_unlock(&r->pm);
}

/* With the GIL, before a walker of the tail (a drain, the poll) reads the ring: the pump is
 * asked to come back, and its lock is waited for with the GIL let go. */
static void
walker_take(Ring *r)
{
    pump_made(r);
    if (pthread_mutex_trylock(&r->wk) == 0)
        return;
    __atomic_add_fetch(&r->wk_wanted, 1, __ATOMIC_SEQ_CST);
    pump_signal(r, PUMP_YIELD);
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&r->wk);
    Py_END_ALLOW_THREADS
    __atomic_sub_fetch(&r->wk_wanted, 1, __ATOMIC_SEQ_CST);
}

static inline void
walker_give(Ring *r)
{
    pthread_mutex_unlock(&r->wk);
}

static PyObject *s_cuda_event;
static PyObject *s_ptr, *s_itemsize, *s_length, *s_fenced, *s_sentinel, *s_free;
static PyObject *s_misuse, *s_misuse_mark, *s_misuse_end, *s_internal_error, *s_queue_full,
    *s_wake, *s_sample, *s_try_clock, *s_copy_to_host, *s_tolist, *s_is_cuda, *s_numel,
    *s_accepted, *s_draft_length, *s_batch_size, *s_emitted, *s_event, *s_dtype,
    *s_is_contiguous, *s_get_device, *s_data_ptr, *s_handle, *s_copy_event_failed, *s_landed,
    *s_oversized;
static PyObject *m_begin_open, *m_end_twice, *m_accept_closed;
static PyObject *m_defer_twice, *m_settle_twice, *m_settle_undeferred, *m_settle_late;

/* -- slots --------------------------------------------------------------------------------- */

/* While a drain (or a drop) walks the ring, the references it lets go of are parked here and
 * dropped only once the ring is consistent again: dropping a caller's object can run Python code
 * (a __del__), which can hand the GIL to another thread mid-walk -- the worker, which could then
 * move the tail under the walk. The garbage collector is off for the same span (a collection
 * runs finalizers too). */
static PyObject *g_defer = NULL;

static void
drop_ref(PyObject **p)
{
    PyObject *o = *p;
    if (o == NULL)
        return;
    *p = NULL;
    if (g_defer != NULL) {
        if (PyList_Append(g_defer, o) == 0) {
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

static void
defer_begin(Deferral *d)
{
    d->outer = g_defer != NULL;
    if (d->outer)
        return;
    d->gc_was = PyGC_Disable();
    d->list = PyList_New(0);
    if (d->list == NULL)
        PyErr_Clear(); /* out of memory: references are dropped at once, as before */
    g_defer = d->list;
}

/* Drop what was parked; may run Python code (the ring is consistent by now). */
static void
defer_end(Deferral *d)
{
    if (d->outer)
        return;
    g_defer = NULL;
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

static void
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
static void
hand_back(Ring *r, PyObject *ev, PyObject *copy)
{
    PyObject *t = PyTuple_Pack(2, ev ? ev : Py_None, copy ? copy : Py_None);
    if (t == NULL || PyList_Append(r->dropped, t) < 0)
        PyErr_Clear();
    Py_XDECREF(t);
}

/* Hand a dropped slot's events and copy to the resolver. */
static void
slot_drop_held(Ring *r, Slot *s)
{
    if (s->ev == NULL && s->copy == NULL)
        return;
    hand_back(r, s->ev, s->copy);
    drop_ref(&s->ev);
    drop_ref(&s->copy);
}

/* -- slow paths: calls into the recorder, never raising into the worker --------------------- */

static void
report_internal(Ring *r)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *res = NULL;
    if (value != NULL)
        res = PyObject_CallMethodOneArg(r->slow, s_internal_error, value);
    Py_XDECREF(res);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();
}

static void
call_slow(Ring *r, PyObject *name, PyObject *const *args, size_t nargs)
{
    PyObject *stack[4];
    stack[0] = r->slow;
    for (size_t i = 0; i < nargs; i++)
        stack[i + 1] = args[i];
    PyObject *res = PyObject_VectorcallMethod(name, stack, nargs + 1, NULL);
    if (res == NULL)
        report_internal(r);
    Py_XDECREF(res);
}

static void
misuse(Ring *r, const char *kind, PyObject *message)
{
    PyObject *k = PyUnicode_InternFromString(kind);
    if (k == NULL) {
        report_internal(r);
        return;
    }
    PyObject *args[2] = {k, message};
    call_slow(r, s_misuse, args, 2);
    Py_DECREF(k);
}

static int
record_event(Ring *r, Slot *s, Py_ssize_t i, int64_t t)
{
    PyObject *ev = PyList_GetItem(s->ev, i);
    if (ev == NULL)
        return -1;
    PyObject *args[2] = {ev, r->stream};
    PyObject *res = PyObject_Vectorcall(r->record_fn, args, 2, NULL);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    s->cost += ring_now(r) - t;
    return 0;
}

static void
void_slot(Ring *r, Slot *s)
{
    STATE_SET(s, SLOT_VOID);
    slot_drop_held(r, s);
}

/* A cycle called out of order: counted as misuse. */
static void
discard(Ring *r, Slot *s)
{
    r->discarded++;
    void_slot(r, s);
}

/* The open handle goes to the spares (kept for reuse), in the first place that is empty or
 * holds a handle somebody else still holds (no use as a spare); else in the last. */
static void
close_current(Ring *r)
{
    PyObject *cur = r->current;
    r->current = NULL;
    if (cur == NULL)
        return;
    int at = NSPARES - 1;
    for (int i = 0; i < NSPARES; i++) {
        if (r->spares[i] == NULL || Py_REFCNT(r->spares[i]) > 1) {
            at = i;
            break;
        }
    }
    PyObject *old = r->spares[at];
    r->spares[at] = cur;
    Py_XDECREF(old);
}

/* A spare handle nobody else holds (taken from the pool), or NULL. */
static Cycle *
take_spare(Ring *r)
{
    for (int i = 0; i < NSPARES; i++) {
        PyObject *sp = r->spares[i];
        if (sp != NULL && Py_REFCNT(sp) == 1) {
            r->spares[i] = NULL;
            return (Cycle *)sp;
        }
    }
    return NULL;
}

/* -- values -------------------------------------------------------------------------------- */

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

static void
set_batch(Slot *s, PyObject *b)
{
    int64_t v;
    Py_CLEAR(s->batch_obj);
    if (exact_int_in(b, 0, MAX_BATCH, &v)) {
        s->batch = v;
        return;
    }
    s->batch = -1;
    Py_INCREF(b);
    s->batch_obj = b;
}

/* begin()'s draft length: taken when an exact int in 0..k_max, else kept for the resolver's
 * verdict (a numpy or torch scalar, or a bad value counted as ``bad_draft_length``). */
static void
set_draft_length(Slot *s, PyObject *k, int k_max)
{
    int64_t v;
    Py_CLEAR(s->dk_obj);
    if (exact_int_in(k, 0, k_max, &v)) {
        s->dk = (int32_t)v;
        return;
    }
    s->dk = -1;
    Py_INCREF(k);
    s->dk_obj = k;
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

/* Store a list or tuple of exact ints in 0..k natively. 1 when stored, 0 when the resolver must
 * validate it (nothing stored), -1 on a memory error. */
/* Room for ``n`` accepted lengths in the slot (grown by doubling, kept for the slot's next
 * cycles); -1 with MemoryError set. */
static int
ensure_lens(Slot *s, Py_ssize_t n)
{
    if (n <= s->lcap)
        return 0;
    Py_ssize_t cap = s->lcap ? s->lcap : 16;
    while (cap < n)
        cap *= 2;
    uint8_t *p = PyMem_RawRealloc(s->lens, (size_t)cap); /* raw: a walk without the GIL reads it */
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    s->lens = p;
    s->lcap = (int32_t)cap;
    return 0;
}

static int
store_lengths(Slot *s, PyObject *seq, int k, Py_ssize_t most)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > most)
        return 0;
    if (ensure_lens(s, n) < 0)
        return -1;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    uint8_t *lens = s->lens;
    int64_t sum = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = items[i];
        if (!PyLong_CheckExact(o))
            return 0;
        /* Small non-negative ints have one digit; anything else is out of 0..k anyway. */
        long v = PyLong_AsLong(o);
        if (v < 0 || v > k) {
            PyErr_Clear();
            return 0;
        }
        lens[i] = (uint8_t)v;
        sum += v;
    }
    s->nseq = (int32_t)n;
    s->k = k;
    s->accsum = sum;
    return 1;
}

/* getattr(o, name) or NULL with no error when it has no such attribute (0); -1 on an error. */
static int
get_optional_attr(PyObject *o, PyObject *name, PyObject **out)
{
    *out = PyObject_GetAttr(o, name);
    if (*out != NULL)
        return 1;
    if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

/* Store a one-dimensional buffer of integers in 0..k natively (numpy arrays, array.array,
 * memoryview). 1 when stored, 0 when not (wrong format or shape, a value out of range: the
 * caller falls back to tolist() and the resolver's validation), -1 on a memory error. */
static int
store_buffer(Slot *s, PyObject *obj, int k, Py_ssize_t most)
{
    if (PyBytes_Check(obj) || PyByteArray_Check(obj) || !PyObject_CheckBuffer(obj))
        return 0;
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_FORMAT | PyBUF_ANY_CONTIGUOUS) < 0) {
        PyErr_Clear();
        return 0;
    }
    int rc = 0;
    const char *f = view.format ? view.format : "B";
    if (*f == '@' || *f == '=' || *f == '<')
        f++;
    Py_ssize_t n = view.ndim == 1 && view.itemsize > 0 ? view.len / view.itemsize : -1;
    char code = f[0] != 0 && f[1] == 0 ? f[0] : 0;
    if (n < 0 || n > most || code == 0 || strchr("bBhHiIlLqQ", code) == NULL)
        goto done;
    if (ensure_lens(s, n) < 0) {
        rc = -1;
        goto done;
    }
    int64_t sum = 0;
    const char *base = view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *p = base + i * view.itemsize;
        int64_t v;
        switch (code) {
        case 'b': v = *(const signed char *)p; break;
        case 'B': v = *(const unsigned char *)p; break;
        case 'h': { short x; memcpy(&x, p, sizeof x); v = x; break; }
        case 'H': { unsigned short x; memcpy(&x, p, sizeof x); v = x; break; }
        case 'i': { int x; memcpy(&x, p, sizeof x); v = x; break; }
        case 'I': { unsigned int x; memcpy(&x, p, sizeof x); v = x; break; }
        case 'l': { long x; memcpy(&x, p, sizeof x); v = x; break; }
        case 'L': { unsigned long x; memcpy(&x, p, sizeof x); v = x > INT64_MAX ? -1 : (int64_t)x; break; }
        case 'q': { long long x; memcpy(&x, p, sizeof x); v = x; break; }
        default: { unsigned long long x; memcpy(&x, p, sizeof x); v = x > INT64_MAX ? -1 : (int64_t)x; break; }
        }
        if (v < 0 || v > k)
            goto done;
        s->lens[i] = (uint8_t)v;
        sum += v;
    }
    s->nseq = (int32_t)n;
    s->k = k;
    s->accsum = sum;
    rc = 1;
done:
    PyBuffer_Release(&view);
    return rc;
}

/* -- the Cycle handle ---------------------------------------------------------------------- */

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

static PyObject *
Cycle_mark(Cycle *self, PyObject *phase)
{
    Ring *r = self->ring;
    int64_t t = ring_now(r);
    if (self->closed) {
        PyObject *args[3] = {Py_True, phase, Py_None};
        call_slow(r, s_misuse_mark, args, 3);
        Py_RETURN_NONE;
    }
    Slot *s = slot_of(self);
    int i = s->nts;
    int ok = 0;
    if (i < r->nph) {
        PyObject *want = PyTuple_GET_ITEM(r->phases, i);
        ok = want == phase;
        if (!ok) {
            ok = PyObject_RichCompareBool(want, phase, Py_EQ);
            if (ok < 0) {
                report_internal(r);
                Py_RETURN_NONE;
            }
            if (self->closed || !owns(self, s) || s->nts != i)
                Py_RETURN_NONE; /* closed meanwhile by another thread's begin (counted there) */
        }
    }
    if (!ok) {
        PyObject *reached = PyLong_FromLong(i);
        if (reached == NULL) {
            report_internal(r);
            Py_RETURN_NONE;
        }
        PyObject *args[3] = {Py_False, phase, reached};
        call_slow(r, s_misuse_mark, args, 3);
        Py_DECREF(reached);
        Py_RETURN_NONE;
    }
    s->ts[i] = t;
    s->nts = i + 1;
    if (s->ev != NULL && record_event(r, s, i, t) < 0)
        report_internal(r);
    Py_RETURN_NONE;
}

/* Make room for one more slot: drop the oldest while the ring holds ``capacity``. A done slot
 * dropped is a cycle lost (counted); a void one was never a cycle; an open one can only be a
 * cycle another thread is ending right now (misuse), which then finds its slot gone. Returns
 * whether a done cycle was dropped. */
static int
make_room(Ring *r)
{
    int dropped = 0;
    if ((Py_ssize_t)(r->head - LOAD64(&r->tail)) < r->capacity)
        return 0; /* the common case: a walk only ever makes more room */
    Deferral d = {NULL, 0, 1};
    /* A walk without the GIL may be moving the tail: wait for it (bounded by its chunk). No
     * Python code runs while the lock is held (what is let go of is parked until after). */
    ring_lock(r);
    while ((Py_ssize_t)(r->head - r->tail) >= r->capacity) {
        if (d.outer && g_defer == NULL)
            defer_begin(&d); /* only when something is dropped: begin() allocates nothing */
        Slot *old = &r->slots[r->tail % (uint64_t)r->nslots];
        if (STATE(old) == SLOT_DONE) {
            r->dropped_queue_full++;
            ADDN(&r->waiting, -1);
            ADDN(&r->nheld, -(Py_ssize_t)(old->ev != NULL || old->copy != NULL));
            dropped = 1;
        }
        else if (STATE(old) == SLOT_OPEN)
            r->dropped_queue_full++;
        else if (STATE(old) == SLOT_DEFERRED) {
            /* Never settled, and the ring needs its slot: lost with its times (the resolver
             * hands such a cycle on before, once settle_backlog cycles wait behind it, unless
             * it is not keeping up). */
            r->unsettled++;
            r->deferred--;
        }
        STATE_SET(old, SLOT_VOID);
        slot_drop_held(r, old);
        slot_clear_objs(r, old);
        STORE64(&r->tail, r->tail + 1);
    }
    ring_unlock(r);
    defer_end(&d);
    return dropped;
}

static PyObject *
Cycle_end(Cycle *self, PyObject *Py_UNUSED(ignored))
{
    Ring *r = self->ring;
    int64_t t = ring_now(r);
    if (self->closed) {
        misuse(r, "end_without_begin", m_end_twice);
        Py_RETURN_NONE;
    }
    self->closed = 1;
    if (r->current == (PyObject *)self)
        close_current(r);
    Slot *s = slot_of(self);
    if (!owns(self, s))
        Py_RETURN_NONE; /* discarded already (and counted) */
    if (self->index < 0) {
        STATE_SET(s, SLOT_VOID); /* begun in CUDA graph capture: counted when it began */
        Py_RETURN_NONE;
    }
    if (s->nts != r->nph) {
        discard(r, s);
        PyObject *reached = PyLong_FromLong(s->nts);
        if (reached == NULL) {
            report_internal(r);
            Py_RETURN_NONE;
        }
        call_slow(r, s_misuse_end, &reached, 1);
        Py_DECREF(reached);
        Py_RETURN_NONE;
    }
    s->ts[r->nph] = t;
    s->nts = r->nph + 1;
    if (s->ev != NULL && record_event(r, s, r->nph, t) < 0)
        report_internal(r);
    if (!owns(self, s))
        Py_RETURN_NONE; /* dropped while the event was recorded (counted there) */
    if (self->settle_state == DEFER_AWAITING) {
        STATE_SET(s, SLOT_DEFERRED); /* defer(): handed on by settle() or expire() */
        r->deferred++;
        Py_RETURN_NONE;
    }
    hand_on(r, s);
    Py_RETURN_NONE;
}

/* ``o.name()`` as a C integer; -1 with an exception set on failure (``*ok`` says which). */
static long long
call_ll(PyObject *o, PyObject *name, int *ok)
{
    PyObject *v = PyObject_CallMethodNoArgs(o, name);
    long long x = -1;
    *ok = 0;
    if (v != NULL) {
        x = PyLong_AsLongLong(v);
        *ok = !(x == -1 && PyErr_Occurred());
        Py_DECREF(v);
    }
    return x;
}

/* A pinned copy's address and element size, with its event handle or its length (whichever
 * pointer is not NULL): member slots of the clock's copy type, read with no Python code run.
 * 0, or -1 with the error set. */
static int
pinned_fields(PyObject *o, void **ptr, long *itemsize, void **handle, Py_ssize_t *length)
{
    PyObject *po = PyObject_GetAttr(o, s_ptr);
    PyObject *io = po ? PyObject_GetAttr(o, s_itemsize) : NULL;
    PyObject *xo = io ? PyObject_GetAttr(o, handle != NULL ? s_handle : s_length) : NULL;
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

/* Start the copy of a CUDA acceptance tensor into a free pinned slot, on the stream current for
 * its device, and on one copy in ``nc_fence_every`` record the slot's event after it (the others
 * fill the slot with the sentinel first and set ``fenced`` False): one or two calls into the CUDA
 * runtime, the GIL held, no Python code of specobs. 1: started (``*out``: the slot, a new reference); 0: this
 * tensor is for the Python path (another dtype or device, not contiguous, too long, no free slot,
 * or the runtime refused the copy); -1: an exception. */
typedef struct {
    void *ptr; /* the pinned buffer the copy lands in */
    int32_t isz, len, fenced;
    PyObject *pool; /* the pool it came from (borrowed: the ring's pools hold it) */
} NativeCopy;

/* A copy the pump read and parked, of ``pool``: the worker takes it back here, under the ring's
 * lock (the pump parks under it), instead of waiting for the resolver to return it to its pool.
 * A new reference (moved from the parking), or NULL. */
static PyObject *
parked_copy(Ring *r, PyObject *pool)
{
    if (r->pk_cpool == NULL || __atomic_load_n(&r->pk_ncopies, __ATOMIC_RELAXED) == 0)
        return NULL;
    PyObject *slot = NULL;
    ring_lock(r);
    for (Py_ssize_t i = r->pk_ncopies - 1; i >= 0; i--)
        if (r->pk_cpool[i] == pool) {
            Py_ssize_t last = r->pk_ncopies - 1;
            slot = r->pk_buf[i];
            r->pk_buf[i] = r->pk_buf[last];
            r->pk_cpool[i] = r->pk_cpool[last];
            r->pk_ncopies = last;
            break;
        }
    ring_unlock(r);
    return slot;
}

static int
native_copy(Ring *r, PyObject *tensor, PyObject **out, NativeCopy *nc)
{
    PyObject *dtype = PyObject_GetAttr(tensor, s_dtype);
    if (dtype == NULL)
        return -1;
    PyObject *pool = PyDict_GetItemWithError(r->nc_pools, dtype); /* borrowed */
    Py_DECREF(dtype);
    if (pool == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyList_CheckExact(pool))
        return 0;
    int ok;
    long long n = call_ll(tensor, s_numel, &ok);
    if (!ok)
        return -1;
    if (n < 0 || n > r->nc_capacity)
        return 0;
    PyObject *contig = PyObject_CallMethodNoArgs(tensor, s_is_contiguous);
    if (contig == NULL)
        return -1;
    int c = PyObject_IsTrue(contig);
    Py_DECREF(contig);
    if (c != 1)
        return c < 0 ? -1 : 0;
    long long dev = call_ll(tensor, s_get_device, &ok);
    if (!ok)
        return -1;
    if (dev != r->nc_device)
        return 0;
    PyObject *dp = PyObject_CallMethodNoArgs(tensor, s_data_ptr);
    if (dp == NULL)
        return -1;
    void *src = PyLong_AsVoidPtr(dp);
    Py_DECREF(dp);
    if (src == NULL && PyErr_Occurred())
        return -1;
    PyObject *devo = PyLong_FromLongLong(dev);
    PyObject *so = devo ? PyObject_CallOneArg(r->nc_stream_fn, devo) : NULL;
    Py_XDECREF(devo);
    if (so == NULL)
        return -1;
    void *stream = PyLong_AsVoidPtr(so);
    Py_DECREF(so);
    if (stream == NULL && PyErr_Occurred())
        return -1;
    /* No Python code runs from here to the pop: the pool cannot change under it. */
    Py_ssize_t nfree = PyList_GET_SIZE(pool);
    PyObject *slot = parked_copy(r, pool);
    if (slot != NULL)
        nfree++; /* as if it had been handed back to the pool first */
    nfree += __atomic_load_n(&r->pk_ncopies, __ATOMIC_RELAXED); /* free too, for the worker */
    if (slot != NULL)
        ;
    else if (PyList_GET_SIZE(pool) == 0)
        return 0;
    else {
        Py_ssize_t last = PyList_GET_SIZE(pool);
        slot = PyList_GET_ITEM(pool, last - 1);
        Py_INCREF(slot);
        if (PyList_SetSlice(pool, last - 1, last, NULL) < 0) {
            Py_DECREF(slot);
            return -1;
        }
    }
    void *dst = NULL, *handle = NULL;
    long isz = 0;
    int ret;
    if (pinned_fields(slot, &dst, &isz, &handle, NULL) < 0 || (isz != 4 && isz != 8)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "a pinned slot of a bad element size");
        ret = -1; /* the slot goes back; the error is reported either way */
        goto give_back;
    }
    int fence = r->nc_since_fence + 1 >= r->nc_fence_every || stream != r->nc_last_stream
                || nfree - 1 < r->nc_low;
    /* Every copy: the resolver learns that it (and all before it on the stream) completed from
     * its values landing over the sentinel, without asking the driver. */
    memset(dst, SENTINEL_BYTE, (size_t)n * (size_t)isz);
    if (r->nc_memcpy(dst, src, (size_t)n * (size_t)isz, 2 /* device to host */, stream) != 0) {
        r->nc_lasterr(); /* never left for the engine's next launch check to raise */
        ret = 0;         /* the Python path copies through torch */
        goto give_back;
    }
    PyObject *len = PyLong_FromLongLong(n);
    if (len == NULL || PyObject_SetAttr(slot, s_length, len) < 0
        || PyObject_SetAttr(slot, s_fenced, fence ? Py_True : Py_False) < 0
        || PyObject_SetAttr(slot, s_sentinel, Py_True) < 0) {
        Py_XDECREF(len);
        Py_DECREF(slot); /* its copy is in flight: it may not go back before it completed */
        return -1;
    }
    Py_DECREF(len);
    r->nc_last_stream = stream;
    r->nc_since_fence = fence ? 0 : r->nc_since_fence + 1;
    r->nc_fences += fence;
    if (fence && r->nc_record(handle, stream) != 0) {
        r->nc_lasterr();
        /* Rare: the recorder records the slot's event through torch instead. */
        PyObject *res = PyObject_CallMethodOneArg(r->slow, s_copy_event_failed, slot);
        if (res == NULL) {
            Py_DECREF(slot);
            return -1;
        }
        Py_DECREF(res);
    }
    r->nc_copies++;
    nc->ptr = dst;
    nc->isz = (int32_t)isz;
    nc->len = (int32_t)n;
    nc->fenced = fence;
    nc->pool = pool;
    if (nfree - 1 < r->nc_low) {
        /* Slots come back only once read: the pump reads them and parks them for this
         * function to take back (no Python needed), else the resolver's drain. */
        if (pump_active(r))
            pump_signal(r, PUMP_PASS);
        else
            call_slow(r, s_wake, NULL, 0);
    }
    *out = slot;
    return 1;

give_back: /* no copy is in flight from the slot: it returns to the pool */
    if (PyList_Append(pool, slot) < 0)
        ret = -1;
    Py_DECREF(slot);
    return ret;
}

/* The acceptance of a CUDA tensor: a copy started here (or by the recorder), read by the
 * resolver. */
static void
accept_cuda(Ring *r, Cycle *c, Slot *s, PyObject *tensor, int32_t ck)
{
    int64_t t = ring_now(r);
    PyObject *copy = NULL;
    NativeCopy nc = {NULL, 0, 0, 0, NULL};
    if (r->nc_memcpy != NULL) {
        int done = native_copy(r, tensor, &copy, &nc);
        if (done < 0) {
            report_internal(r);
            copy = NULL;
        }
    }
    if (copy == NULL)
        copy = PyObject_CallMethodOneArg(r->slow, s_copy_to_host, tensor);
    r->copy_ns += ring_now(r) - t;
    if (copy == NULL) {
        report_internal(r);
        return;
    }
    if (!owns(c, s) || c->closed) { /* closed by another thread meanwhile */
        if (copy != Py_None)
            hand_back(r, NULL, copy);
        Py_DECREF(copy);
        return;
    }
    if (copy == Py_None) {
        Py_DECREF(copy);
        if (s->batch < 0 && s->batch_obj == NULL) {
            PyObject *n = PyObject_CallMethodNoArgs(tensor, s_numel);
            int64_t v;
            if (n != NULL && owns(c, s) && exact_int_in(n, 0, MAX_BATCH, &v))
                s->batch = v;
            else if (n == NULL)
                PyErr_Clear();
            Py_XDECREF(n);
        }
        return;
    }
    Py_XSETREF(s->copy, copy);
    s->has_obj_acc = 1;
    s->cptr = nc.ptr; /* NULL for a copy the recorder started */
    s->cisz = nc.isz;
    s->clen = nc.len;
    s->cfenced = nc.fenced;
    s->cpool = nc.pool;
    s->ck = ck;
}

/* What accept() and settle() take, as specobs/_model.py's CycleHandle states it: ``accepted``
 * by position or by name, then ``draft_length``, ``batch_size`` and ``emitted`` by name only
 * (None when not given). Borrowed references. */
typedef struct {
    PyObject *accepted, *draft, *batch, *emitted;
} AcceptArgs;

static int
kw_is(PyObject *name, PyObject *interned)
{
    return name == interned || PyUnicode_Compare(name, interned) == 0;
}

/* The arguments of ``fn`` (accept or settle) read into ``a``: 0, or -1 with the TypeError
 * Python's own binding would raise, before the call changes anything. */
static int
parse_accept_args(const char *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                  AcceptArgs *a)
{
    if (nargs > 1) {
        /* Worded as Python words a method's (self counted), as the pure-Python ring's read. */
        PyErr_Format(PyExc_TypeError, "%s() takes 2 positional arguments but %zd were given", fn,
                     nargs + 1);
        return -1;
    }
    a->accepted = nargs == 1 ? args[0] : NULL;
    a->draft = a->batch = a->emitted = Py_None;
    Py_ssize_t nk = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nk; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        PyObject *v = args[nargs + i];
        if (kw_is(name, s_draft_length))
            a->draft = v;
        else if (kw_is(name, s_batch_size))
            a->batch = v;
        else if (kw_is(name, s_emitted))
            a->emitted = v;
        else if (kw_is(name, s_accepted) && a->accepted == NULL)
            a->accepted = v;
        else if (kw_is(name, s_accepted)) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument 'accepted'", fn);
            return -1;
        }
        else {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", fn,
                         name);
            return -1;
        }
    }
    if (a->accepted == NULL) {
        PyErr_Format(PyExc_TypeError, "%s() missing 1 required positional argument: 'accepted'",
                     fn);
        return -1;
    }
    return 0;
}

/* What a kept object is estimated to hold (specobs._ring.payload_bytes): an exact list or
 * tuple 56 bytes and 8 a value (its items are small ints, cached), an exact int or None
 * nothing, anything else 64. */
static inline int64_t
payload_bytes(PyObject *o)
{
    if (o == NULL || o == Py_None || PyLong_CheckExact(o))
        return 0;
    if (PyList_CheckExact(o) || PyTuple_CheckExact(o))
        return 56 + 8 * (int64_t)Py_SIZE(o);
    return 64;
}

/* Most sequences one accept() stores natively: the bound on a cycle, and never past the
 * slot's own. */
static inline Py_ssize_t
native_most(const Ring *r)
{
    return r->max_seq < NATIVE_MAX_SEQ ? r->max_seq : NATIVE_MAX_SEQ;
}

/* The values of an exact list or tuple (-1: not one). */
static inline Py_ssize_t
payload_len(PyObject *o)
{
    return PyList_CheckExact(o) || PyTuple_CheckExact(o) ? Py_SIZE(o) : -1;
}

/* The cycle's acceptance refused for its size (``kind``: "sequences", more than max_seq in one
 * list; "bytes", past max_queue_bytes): it keeps its times and batch size, no tokens; counted
 * and logged by the recorder (``oversized``). Its acceptance was cleared before. */
static void
refuse_payload(Ring *r, Slot *s, const char *kind, int64_t got, int64_t bound)
{
    s->nseq = -1;
    s->ak = -1;
    s->has_obj_acc = 0;
    PyObject *k = PyUnicode_InternFromString(kind);
    PyObject *g = k ? PyLong_FromLongLong(got) : NULL;
    PyObject *b = g ? PyLong_FromLongLong(bound) : NULL;
    if (b == NULL)
        report_internal(r);
    else {
        PyObject *args[3] = {k, g, b};
        call_slow(r, s_oversized, args, 3);
    }
    Py_XDECREF(k);
    Py_XDECREF(g);
    Py_XDECREF(b);
}

/* The draft length and emitted counts a cycle's acceptance came with (``None``: not given),
 * kept for the resolver's validation; the slot holds none before. */
static void
keep_draft_emitted(Slot *s, PyObject *draft, PyObject *emitted)
{
    if (draft != Py_None) {
        Py_INCREF(draft);
        s->draft = draft;
    }
    if (emitted != Py_None) {
        Py_INCREF(emitted);
        s->emitted = emitted;
    }
}

/* accept() with its arguments read: what a caller passed is counted, never raised. */
static PyObject *
accept_parsed(Cycle *self, const AcceptArgs *a)
{
    Ring *r = self->ring;
    PyObject *accepted = a->accepted, *draft = a->draft, *batch = a->batch;
    PyObject *emitted = a->emitted;
    if (self->closed) {
        misuse(r, "bad_acceptance", m_accept_closed);
        Py_RETURN_NONE;
    }
    Slot *s = slot_of(self);
    if (!owns(self, s))
        Py_RETURN_NONE;
    if (batch != Py_None)
        set_batch(s, batch);
    /* A later accept() replaces an earlier one. */
    s->nseq = -1;
    s->has_obj_acc = 0;
    slot_payload(r, s, 0);
    Py_CLEAR(s->acc);
    Py_CLEAR(s->draft);
    Py_CLEAR(s->emitted);
    if (s->copy != NULL) {
        /* A copy already in flight for this cycle: the resolver releases it. */
        hand_back(r, NULL, s->copy);
        Py_CLEAR(s->copy);
    }
    /* What one cycle may carry: at most max_seq values in each list, and the objects the
     * waiting cycles keep within max_queue_bytes (what the drafts and emitted counts hold is
     * known now, the acceptance's once it is read). */
    Py_ssize_t most = payload_len(draft) > payload_len(emitted) ? payload_len(draft)
                                                                : payload_len(emitted);
    if (most > r->max_seq || payload_len(accepted) > r->max_seq) {
        Py_ssize_t got = payload_len(accepted) > most ? payload_len(accepted) : most;
        refuse_payload(r, s, "sequences", got, r->max_seq);
        Py_RETURN_NONE;
    }
    int64_t with = payload_bytes(draft) + payload_bytes(emitted);
    int64_t k = r->k_max;
    int native_k = draft == Py_None || exact_int_in(draft, 0, r->k_max, &k);
    s->ak = draft != Py_None && native_k ? (int32_t)k : -1;
    PyObject *values = NULL; /* a new reference when tolist() made it */
    PyObject *seq = NULL;
    if (PyList_CheckExact(accepted) || PyTuple_CheckExact(accepted)) {
        seq = accepted;
    }
    else {
        if (native_k && emitted == Py_None) {
            int stored = store_buffer(s, accepted, (int)k, native_most(r));
            if (stored == 1)
                Py_RETURN_NONE;
            if (stored < 0) {
                report_internal(r);
                Py_RETURN_NONE;
            }
        }
        PyObject *is_cuda = NULL;
        if (get_optional_attr(accepted, s_is_cuda, &is_cuda) < 0) {
            report_internal(r);
            Py_RETURN_NONE;
        }
        int cuda = is_cuda != NULL && PyObject_IsTrue(is_cuda) == 1;
        Py_XDECREF(is_cuda);
        PyErr_Clear();
        if (!owns(self, s) || self->closed)
            Py_RETURN_NONE;
        if (cuda) {
            if (r->queued_bytes + with > r->max_queue_bytes) {
                refuse_payload(r, s, "bytes", r->queued_bytes + with, r->max_queue_bytes);
                Py_RETURN_NONE;
            }
            keep_draft_emitted(s, draft, emitted);
            slot_payload(r, s, with);
            accept_cuda(r, self, s, accepted, native_k && emitted == Py_None ? (int32_t)k : -1);
            Py_RETURN_NONE;
        }
        PyObject *tolist = NULL;
        if (get_optional_attr(accepted, s_tolist, &tolist) < 0) {
            report_internal(r);
            Py_RETURN_NONE;
        }
        if (tolist != NULL) { /* numpy array or CPU tensor: copied now, the caller may reuse it */
            values = PyObject_CallNoArgs(tolist);
            Py_DECREF(tolist);
            if (values == NULL) {
                report_internal(r);
                Py_RETURN_NONE;
            }
            if (!owns(self, s) || self->closed) {
                Py_DECREF(values);
                Py_RETURN_NONE;
            }
            if (payload_len(values) > r->max_seq) {
                Py_ssize_t got = payload_len(values);
                Py_DECREF(values);
                refuse_payload(r, s, "sequences", got, r->max_seq);
                Py_RETURN_NONE;
            }
            if (PyList_CheckExact(values))
                seq = values;
        }
    }
    if (seq != NULL && native_k && emitted == Py_None) {
        int stored = store_lengths(s, seq, (int)k, native_most(r));
        if (stored == 1) {
            Py_XDECREF(values);
            Py_RETURN_NONE;
        }
        if (stored < 0) {
            Py_XDECREF(values);
            report_internal(r);
            Py_RETURN_NONE;
        }
    }
    /* Kept for the resolver's validation: a copy of a list or tuple (the engine may reuse it),
     * what tolist() gave, or the object itself; within what the queue may keep. */
    with += payload_bytes(values != NULL ? values : seq != NULL ? seq : accepted);
    if (r->queued_bytes + with > r->max_queue_bytes) {
        Py_XDECREF(values);
        refuse_payload(r, s, "bytes", r->queued_bytes + with, r->max_queue_bytes);
        Py_RETURN_NONE;
    }
    PyObject *keep;
    if (values != NULL)
        keep = values;
    else if (seq != NULL) {
        keep = PyList_CheckExact(seq) ? PyList_GetSlice(seq, 0, PY_SSIZE_T_MAX)
                                      : PySequence_List(seq);
        if (keep == NULL) {
            report_internal(r);
            Py_RETURN_NONE;
        }
    }
    else {
        Py_INCREF(accepted);
        keep = accepted;
    }
    s->acc = keep;
    s->has_obj_acc = 1;
    keep_draft_emitted(s, draft, emitted);
    slot_payload(r, s, with);
    Py_RETURN_NONE;
}

static PyObject *
Cycle_accept(Cycle *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    AcceptArgs a;
    if (parse_accept_args("Cycle.accept", args, nargs, kwnames, &a) < 0)
        return NULL;
    return accept_parsed(self, &a);
}

/* -- deferred acceptance (see PyCycle.defer / settle in specobs/_ring.py) ------------------ */

/* No tokens and no batch size for this cycle (its times stay). */
static void
clear_acceptance(Ring *r, Slot *s)
{
    s->nseq = -1;
    s->ak = -1;
    s->has_obj_acc = 0;
    s->batch = -1;
    PyObject *dk_obj = s->dk_obj; /* begin()'s draft length stays the cycle's */
    s->dk_obj = NULL;
    slot_clear_objs(r, s);
    s->dk_obj = dk_obj;
    if (s->copy != NULL) {
        hand_back(r, NULL, s->copy);
        drop_ref(&s->copy);
    }
    s->cptr = NULL;
    s->ck = -1;
}

/* A cycle is done (ended, or a deferred one settled or expired): the resolver may take it. */
static void
hand_on(Ring *r, Slot *s)
{
    STATE_SET(s, SLOT_DONE);
    r->enqueued++;
    if (s->ev != NULL || s->copy != NULL)
        ADDN(&r->nheld, 1);
    Py_ssize_t w = ADDN(&r->waiting, 1);
    /* A deferred cycle holds up the ones behind it: the resolver hands it on unsettled once
     * settle_backlog wait (see expire), so it is woken then too. */
    if (w >= r->wake_at || (r->deferred > 0 && w >= r->settle_backlog)) {
        if (pump_active(r))
            pump_signal(r, PUMP_PASS); /* the pump walks now; no Python is needed */
        else
            call_slow(r, s_wake, NULL, 0);
    }
}

static PyObject *
Cycle_defer(Cycle *self, PyObject *Py_UNUSED(ignored))
{
    if (self->closed) {
        misuse(self->ring, "end_without_begin", m_defer_twice);
        return Py_NewRef(self);
    }
    self->settle_state = DEFER_AWAITING;
    PyObject *res = Cycle_end(self, NULL);
    if (res == NULL)
        return NULL;
    Py_DECREF(res);
    Slot *s = slot_of(self);
    if (STATE(s) != SLOT_DEFERRED || s->idx != self->seq)
        self->settle_state = DEFER_NOTHING; /* discarded (counted there), or graph capture */
    return Py_NewRef(self);
}

static PyObject *
Cycle_settle(Cycle *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Ring *r = self->ring;
    AcceptArgs a;
    if (parse_accept_args("Cycle.settle", args, nargs, kwnames, &a) < 0)
        return NULL;
    int st = self->settle_state;
    if (st == DEFER_NOTHING)
        Py_RETURN_NONE;
    if (st != DEFER_AWAITING) {
        misuse(r, "bad_settle", st == DEFER_SETTLED ? m_settle_twice : m_settle_undeferred);
        Py_RETURN_NONE;
    }
    self->settle_state = DEFER_SETTLED;
    Slot *s = slot_of(self);
    if (STATE(s) != SLOT_DEFERRED || s->idx != self->seq) {
        misuse(r, "bad_settle", m_settle_late);
        Py_RETURN_NONE;
    }
    r->deferred--;
    /* Open again for accept() only: nothing but settle() holds this handle's slot, and the
     * drain stops at an open slot as at a deferred one. */
    STATE_SET(s, SLOT_OPEN);
    self->closed = 0;
    PyObject *res;
    if (a.accepted == Py_None) {
        clear_acceptance(r, s);
        res = Py_NewRef(Py_None);
    }
    else
        res = accept_parsed(self, &a);
    self->closed = 1;
    if (owns(self, s))
        hand_on(r, s); /* else dropped by a full ring meanwhile (counted there) */
    return res;
}

static PyObject *
Cycle_enter(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    Py_INCREF(self);
    return self;
}

static PyObject *
Cycle_exit(Cycle *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs >= 1 && args[0] != Py_None) {
        /* The engine raised mid-cycle: the phase times are meaningless, discard quietly. */
        if (!self->closed) {
            Ring *r = self->ring;
            self->closed = 1;
            if (r->current == (PyObject *)self)
                close_current(r);
            Slot *s = slot_of(self);
            if (owns(self, s)) {
                r->excepted++; /* not misuse: counted under a reason of its own */
                void_slot(r, s);
            }
        }
        Py_RETURN_NONE;
    }
    if (!self->closed)
        return Cycle_end(self, NULL);
    Py_RETURN_NONE;
}

static int
Cycle_traverse(Cycle *self, visitproc visit, void *arg)
{
    Py_VISIT(self->ring);
    return 0;
}

static int
Cycle_clear(Cycle *self)
{
    Py_CLEAR(self->ring);
    return 0;
}

static void
Cycle_dealloc(Cycle *self)
{
    PyObject_GC_UnTrack(self);
    Cycle_clear(self);
    PyObject_GC_Del(self);
}

static PyMethodDef Cycle_methods[] = {
    {"mark", (PyCFunction)Cycle_mark, METH_O,
     "mark($self, phase, /)\n--\n\n"
     "End the running phase and start ``phase`` (the next one in the configured order)."},
    {"accept", (PyCFunction)(void (*)(void))Cycle_accept, METH_FASTCALL | METH_KEYWORDS,
     "accept($self, accepted, *, draft_length=None, batch_size=None, emitted=None)\n--\n\n"
     "Record acceptance for this cycle (see specobs.CycleHandle.accept)."},
    {"end", (PyCFunction)Cycle_end, METH_NOARGS, "End the last phase and hand the cycle on."},
    {"defer", (PyCFunction)Cycle_defer, METH_NOARGS,
     "End the cycle with its acceptance to come from settle(); returns the handle."},
    {"settle", (PyCFunction)(void (*)(void))Cycle_settle, METH_FASTCALL | METH_KEYWORDS,
     "settle($self, accepted, *, draft_length=None, batch_size=None, emitted=None)\n--\n\n"
     "Give a deferred cycle its acceptance (None: no tokens) and hand it on."},
    {"__enter__", Cycle_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Cycle_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Cycle_members[] = {
    {"index", T_LONGLONG, offsetof(Cycle, index), READONLY, "the cycle's index"},
    {"_closed", T_INT, offsetof(Cycle, closed), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject CycleType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "specobs._core.Cycle",
    .tp_basicsize = sizeof(Cycle),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One speculative decoding cycle in flight (native). Created by Observer.begin.",
    .tp_traverse = (traverseproc)Cycle_traverse,
    .tp_clear = (inquiry)Cycle_clear,
    .tp_dealloc = (destructor)Cycle_dealloc,
    .tp_methods = Cycle_methods,
    .tp_members = Cycle_members,
};

/* -- Ring: the worker's side --------------------------------------------------------------- */

/* The calling thread's kernel id (what /proc/self/task/<id>/schedstat is named by), read from
 * its thread state, which holds it from the thread's start: a load, not a gettid() system call
 * per cycle. 0 where the interpreter keeps no native id (before 3.11). */
static inline unsigned long
writer_id(void)
{
#if PY_VERSION_HEX >= 0x030B0000
    return PyThreadState_Get()->native_thread_id;
#else
    return 0;
#endif
}

static PyObject *
Ring_begin(Ring *r, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    int64_t t = ring_now(r);
    PyObject *batch = Py_None, *draft = Py_None;
    Py_ssize_t nk = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs > 2) {
        PyErr_SetString(PyExc_TypeError,
                        "begin() takes at most two arguments (batch_size, draft_length)");
        return NULL;
    }
    if (nargs >= 1)
        batch = args[0];
    if (nargs == 2)
        draft = args[1];
    for (Py_ssize_t i = 0; i < nk; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (kw_is(name, s_batch_size) && nargs < 1)
            batch = args[nargs + i];
        else if (kw_is(name, s_draft_length) && nargs < 2)
            draft = args[nargs + i];
        else if (kw_is(name, s_batch_size) || kw_is(name, s_draft_length)) {
            PyErr_Format(PyExc_TypeError, "begin() got multiple values for argument %R", name);
            return NULL;
        }
        else {
            PyErr_Format(PyExc_TypeError, "begin() got an unexpected keyword argument %R", name);
            return NULL;
        }
    }
    if (!r->enabled) {
        Py_INCREF(r->null_cycle);
        return r->null_cycle;
    }
    r->writer = writer_id();
    /* Every write to the ring happens before any call into Python (a call may let another
     * thread in: misuse, but it must not corrupt what is counted). */
    int was_open = 0;
    if (r->current != NULL) {
        /* Closed before any call: whoever closes a cycle first is the only one. */
        Cycle *cur = (Cycle *)r->current;
        cur->closed = 1;
        Slot *old = slot_of(cur);
        if (owns(cur, old))
            discard(r, old);
        close_current(r);
        was_open = 1;
    }
    int full = make_room(r);
    Slot *s = &r->slots[r->head % (uint64_t)r->nslots];
    if (s->acc || s->draft || s->emitted || s->batch_obj || s->dk_obj || s->ev || s->copy) {
        /* Normally cleared when the tail passed it; dropping them may run Python code, so
         * before the slot is reserved, and the head read again after. */
        slot_clear_objs(r, s);
        drop_ref(&s->ev);
        drop_ref(&s->copy);
        s = &r->slots[r->head % (uint64_t)r->nslots];
    }
    uint64_t pos = r->head;
    s->cptr = NULL;
    s->ck = -1;
    /* Open before the head passes it: a walk without the GIL (the pump's, drain_into's) reads
     * every slot below the head, and would skip this one as void (the state a walk left it in)
     * and move the tail past the cycle for good. */
    STATE_SET(s, SLOT_OPEN);
    STORE64(&r->head, pos + 1);
    s->ts[0] = t;
    s->tid = r->writer;
    s->nts = 1;
    s->nseq = -1;
    s->has_obj_acc = 0;
    s->batch = -1;
    s->dk = s->ak = -1;
    s->cost = 0;
    s->evn = 0;
    int64_t idx = r->begun++;
    s->idx = idx;
    if (batch != Py_None)
        set_batch(s, batch);
    if (draft != Py_None)
        set_draft_length(s, draft, r->k_max);
    Cycle *c = take_spare(r);
    if (c == NULL) {
        c = PyObject_GC_New(Cycle, &CycleType);
        if (c == NULL) {
            STATE_SET(s, SLOT_VOID);
            report_internal(r);
            Py_INCREF(r->null_cycle);
            return r->null_cycle;
        }
        Py_INCREF(r);
        c->ring = r;
        PyObject_GC_Track(c);
    }
    c->index = idx;
    c->seq = idx;
    c->pos = pos;
    c->closed = 0;
    c->settle_state = DEFER_NONE;
    Py_INCREF(c);
    r->current = (PyObject *)c; /* one reference here, one returned */
    if (was_open)
        misuse(r, "begin_while_open", m_begin_open);
    if (full)
        call_slow(r, s_queue_full, NULL, 0);
    if (!r->sampling && r->clock_try_at >= 0 && idx >= r->clock_try_at) {
        PyObject *i = PyLong_FromLongLong(idx);
        if (i != NULL) {
            call_slow(r, s_try_clock, &i, 1);
            Py_DECREF(i);
        }
        else
            report_internal(r);
    }
    if (r->sampling && idx % (r->interval > 0 ? r->interval : 1) == 0) {
        /* The recorder checks for graph capture, takes events, records the first. */
        PyObject *tt = PyLong_FromLongLong(t);
        PyObject *ev = NULL;
        if (tt != NULL) {
            PyObject *a[2] = {r->slow, tt};
            ev = PyObject_VectorcallMethod(s_sample, a, 2, NULL);
            Py_DECREF(tt);
        }
        if (ev == NULL)
            report_internal(r);
        else if (!owns(c, s) || c->closed) {
            /* Closed by another thread meanwhile: the events go back. */
            if (PyList_CheckExact(ev))
                hand_back(r, ev, NULL);
            Py_DECREF(ev);
        }
        else if (ev == Py_False) {
            c->index = -1; /* inside CUDA graph capture nothing is real (counted there) */
            Py_DECREF(ev);
        }
        else if (PyList_CheckExact(ev) && PyList_GET_SIZE(ev) == r->nph + 1) {
            s->ev = ev;
            s->cost = ring_now(r) - t;
        }
        else
            Py_DECREF(ev);
    }
    return (PyObject *)c;
}

/* -- Ring: the resolver's side ------------------------------------------------------------- */

/* bucket_of, int64_list, bucketed: specobs/_bucket.h */

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

/* (first index, [(index, events, copy) for the cycles holding events], bound): the first
 * ``limit`` queued cycles. The resolver asks which of the held ones completed and drains up
 * to the first that has not (``bound`` when all have). */
static PyObject *
pending_walked(Ring *r, PyObject *arg)
{
    Py_ssize_t limit = PyLong_AsSsize_t(arg);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    PyObject *held = PyList_New(0);
    if (held == NULL)
        return NULL;
    int64_t bound = 0;
    Py_ssize_t n = 0;
    Slot *s;
    for (uint64_t p = r->tail; n < limit && (s = next_done(r, &p)) != NULL; p++) {
        n++;
        bound = s->idx + 1;
        if (s->ev == NULL && s->copy == NULL)
            continue;
        PyObject *t = Py_BuildValue("(LOO)", (long long)s->idx, s->ev ? s->ev : Py_None,
                                    s->copy ? s->copy : Py_None);
        if (t == NULL || PyList_Append(held, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(held);
            return NULL;
        }
        Py_DECREF(t);
    }
    return Py_BuildValue("(NL)", held, (long long)bound);
}

/* -- the poll ------------------------------------------------------------------------------ */

typedef struct {
    int64_t idx;
    PyObject *ev;   /* owned, or NULL */
    PyObject *copy; /* owned, or NULL */
    /* A native copy's pinned buffer (``Slot.cptr``; NULL: ask the object), element size,
     * length and whether it recorded its event: read with no Python call. */
    const char *cptr;
    int32_t cisz, clen, cfenced;
    uint64_t evlast; /* a sampled cycle's last event's handle, when the ring may query it */
} Held;

/* The truth of a new reference, which it releases: 1, 0, or -1 on an error (``v`` NULL: the
 * call that made it failed). */
static int
truth_of(PyObject *v)
{
    if (v == NULL)
        return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

static int
attr_true(PyObject *o, PyObject *name)
{
    return truth_of(PyObject_GetAttr(o, name));
}

/* Whether ``n`` elements of ``isz`` bytes at ``p`` were all written over the sentinel: accepted
 * counts are never negative; the sentinel, and an element a copy has not written whole, is (its
 * top byte still 0xFF), so the top byte of each element decides. No Python call. */
static int
bytes_landed(const char *p, size_t isz, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((signed char)p[isz * i + isz - 1] < 0)
            return 0;
    return 1;
}

/* Whether a copy's buffer cannot be read (no buffer, elements of neither 4 nor 8 bytes, a length
 * out of 0..2**20): 1 with a ValueError set, else 0. */
static int
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

/* Whether a copy filled with the sentinel has every value written over it (1), not yet or
 * without a sentinel (0), or an error (-1): what its ``landed()`` says, read here from pinned
 * memory for the clock's own copy type, without a Python call. */
static int
copy_landed(Ring *r, PyObject *copy)
{
    if (r->copy_type == NULL || Py_TYPE(copy) != (PyTypeObject *)r->copy_type)
        return truth_of(PyObject_CallMethodNoArgs(copy, s_landed));
    int sent = attr_true(copy, s_sentinel);
    if (sent <= 0)
        return sent;
    void *ptr;
    long isz;
    Py_ssize_t n;
    if (pinned_fields(copy, &ptr, &isz, NULL, &n) < 0)
        return -1;
    if (n == 0)
        return 1;
    if (bad_buffer(ptr, isz, n))
        return -1;
    return bytes_landed(ptr, (size_t)isz, (size_t)n);
}

/* Whether a held copy was filled with the sentinel, has landed over it, recorded its event:
 * from the slot's own fields for a native copy (no Python call), else from the object. */
static int
held_sentinel(Held *h)
{
    return h->cptr != NULL ? 1 : attr_true(h->copy, s_sentinel);
}

static int
held_landed(Ring *r, Held *h)
{
    if (h->cptr == NULL)
        return copy_landed(r, h->copy);
    return bytes_landed(h->cptr, (size_t)h->cisz, (size_t)h->clen);
}

static int
held_fenced(Held *h)
{
    return h->cptr != NULL ? h->cfenced : attr_true(h->copy, s_fenced);
}

/* Whether the last event a held cycle is told by (its sampled events' last, else its copy's)
 * completed: 1, 0, or -1 on an error. */
static int
held_done(Ring *r, PyObject *query, Held *h)
{
    if (h->evlast != 0) { /* through the runtime, no Python (set_native_events) */
        int rc = r->ne_query((void *)(uintptr_t)h->evlast);
        if (rc == 0)
            return 1;
        if (r->ne_lasterr != NULL)
            r->ne_lasterr(); /* "not ready" is kept as the last error: not left for the engine */
        if (rc == 600) /* cudaErrorNotReady */
            return 0;
        /* anything else: asked again through the clock, which says what went wrong */
    }
    PyObject *ev;
    if (h->ev != NULL)
        ev = PySequence_GetItem(h->ev, -1);
    else
        ev = PyObject_GetAttr(h->copy, s_event);
    if (ev == NULL)
        return -1;
    PyObject *v = PyObject_CallOneArg(query, ev);
    Py_DECREF(ev);
    return truth_of(v);
}

static int
held_landed_test(Ring *r, PyObject *query, Held *h)
{
    (void)query;
    return held_landed(r, h);
}

/* The first of the held cycles ``hv[pos[0..n)]`` that ``test`` is false for (``n`` when none),
 * where it is true for a prefix of them: a binary search. -1 on an error. */
static Py_ssize_t
first_false(Ring *r, PyObject *query, Held *hv, const Py_ssize_t *pos, Py_ssize_t n,
            int (*test)(Ring *, PyObject *, Held *))
{
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        int t = test(r, query, &hv[pos[mid]]);
        if (t < 0)
            return -1;
        if (t)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The poll on one stream (see Ring.poll): the index bound, or -1 on an error. */
static int64_t
poll_held(Ring *r, Held *hv, Py_ssize_t nh, int64_t bound, PyObject *query, long polls_before)
{
    /* Without the driver first: the newest copy whose values landed over the sentinel
     * completed, and so did everything before it on the stream (a binary search over the
     * copies filled with the sentinel). */
    Py_ssize_t *pos = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(nh ? nh : 1));
    if (pos == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int64_t out = -1;
    Py_ssize_t nc = 0;
    for (Py_ssize_t i = 0; i < nh; i++) {
        if (hv[i].copy == NULL)
            continue;
        int t = held_sentinel(&hv[i]);
        if (t < 0)
            goto done;
        if (t)
            pos[nc++] = i;
    }
    Py_ssize_t lo = first_false(r, query, hv, pos, nc, held_landed_test);
    if (lo < 0)
        goto done;
    Py_ssize_t start = 0;
    if (lo > 0) {
        Py_ssize_t j = pos[lo - 1];
        start = hv[j].ev != NULL ? j : j + 1; /* events are recorded after the copy */
    }
    if (start == nh) {
        out = bound;
        goto done;
    }
    Held *first = &hv[start];
    if (first->ev == NULL) {
        int sent = held_sentinel(first);
        int land = sent > 0 ? held_landed(r, first) : 0;
        if (sent < 0 || land < 0)
            goto done;
        if (sent && !land) {
            /* In flight; or its values never land (negative counts), which only a later
             * event can settle: asked once it has been first in line for a few polls. */
            r->if_polls = r->if_idx == first->idx ? r->if_polls + 1 : 1;
            r->if_idx = first->idx;
            if (r->if_polls < polls_before) {
                out = first->idx;
                goto done;
            }
        }
    }
    hv += start;
    nh -= start;
    /* The cycles an event tells about: sampled ones and fenced copies. The copies between them
     * recorded no event: those before the last completed event are complete in stream order,
     * those after it once their values landed over the sentinel. */
    Py_ssize_t nt = 0;
    for (Py_ssize_t i = 0; i < nh; i++) {
        int t = hv[i].ev != NULL ? 1 : held_fenced(&hv[i]);
        if (t < 0)
            goto done;
        if (t)
            pos[nt++] = i;
    }
    lo = first_false(r, query, hv, pos, nt, held_done); /* the first whose event is to come */
    if (lo < 0)
        goto done;
    Py_ssize_t stop = lo < nt ? pos[lo] : nh;
    for (Py_ssize_t i = lo ? pos[lo - 1] + 1 : 0; i < stop; i++) {
        int t = held_landed(r, &hv[i]);
        if (t < 0)
            goto done;
        if (!t) {
            out = hv[i].idx;
            goto done;
        }
    }
    out = stop < nh ? hv[stop].idx : bound;
done:
    PyMem_Free(pos);
    return out;
}

/* Stage 1 of the resolver, the poll: the index bound below which the first ``limit`` waiting
 * cycles completed on the GPU, when every event and copy was recorded on one stream (events
 * complete in the order they were recorded there). ``query(event)`` is the clock's. Only the
 * cycles holding events or copies are looked at; what is asked of the driver is a binary
 * search's log2(n) queries at most, and nothing while the newest copies' values are landing
 * over the sentinel. specobs/_ring.py's ``poll`` is the specification. */
static PyObject *
poll_walked(Ring *r, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "poll(limit, query, polls_before_query)");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[0]);
    long polls_before = PyLong_AsLong(args[2]);
    if ((limit == -1 || polls_before == -1) && PyErr_Occurred())
        return NULL;
    PyObject *query = args[1];
    if (LOADN(&r->nheld) == 0) {
        /* Nothing waiting holds events or a copy: every done cycle is complete, and the bound
         * is the open cycle (the only one that can end, with events, before the drain). */
        Cycle *cur = (Cycle *)r->current;
        int64_t open = cur != NULL && owns(cur, slot_of(cur)) ? cur->seq : r->begun;
        /* No further than the first ``limit`` slots: what the bound admits is drained in one
         * chunk (the resolver picks traced cycles below it, once). A slot's position and its
         * cycle's index move together (begin() advances both), so the tail's index is known. */
        int64_t first = (int64_t)r->tail + (r->begun - (int64_t)r->head);
        int64_t most = first + (int64_t)limit;
        return PyLong_FromLongLong(open < most ? open : most);
    }
    Py_ssize_t cap = limit < LOADN(&r->waiting) ? limit : LOADN(&r->waiting);
    int nq = r->ne_query != NULL && r->ne_thread == PyThread_get_thread_ident();
    if (nq)
        fill_handles(r, cap); /* may run Python: before any slot is looked at below */
    Held *hv = PyMem_Malloc(sizeof(Held) * (size_t)(cap > 0 ? cap : 1));
    if (hv == NULL)
        return PyErr_NoMemory();
    int64_t bound = 0;
    Py_ssize_t n = 0, nh = 0;
    /* References taken now: the query is Python code, during which the worker may run and
     * move the ring (the cycles looked at stay alive, and the drain re-reads the ring). */
    Slot *s;
    for (uint64_t p = r->tail; n < limit && nh < cap && (s = next_done(r, &p)) != NULL; p++) {
        n++;
        bound = s->idx + 1;
        if (s->ev == NULL && s->copy == NULL)
            continue;
        hv[nh].idx = s->idx;
        hv[nh].ev = s->ev;
        hv[nh].copy = s->copy;
        hv[nh].cptr = s->copy != NULL && (s->cisz == 4 || s->cisz == 8) ? s->cptr : NULL;
        hv[nh].cisz = s->cisz;
        hv[nh].clen = s->clen;
        hv[nh].cfenced = s->cfenced;
        hv[nh].evlast = nq && s->ev != NULL && s->evn == r->nph + 1 ? s->evh[r->nph] : 0;
        Py_XINCREF(s->ev);
        Py_XINCREF(s->copy);
        nh++;
    }
    int64_t out = bound;
    if (nh && query != Py_None)
        out = poll_held(r, hv, nh, bound, query, polls_before);
    for (Py_ssize_t i = 0; i < nh; i++) {
        Py_XDECREF(hv[i].ev);
        Py_XDECREF(hv[i].copy);
    }
    PyMem_Free(hv);
    if (out < 0)
        return NULL;
    return PyLong_FromLongLong(out);
}

/* The class of the details a drain hands over: specobs._ring.Detail, a tuple subclass whose
 * fields name the positions below (set once by specobs/_ring.py); NULL: plain tuples. */
static PyTypeObject *detail_type = NULL;
#define DETAIL_FIELDS 13

static PyObject *
core_set_detail_type(PyObject *Py_UNUSED(m), PyObject *cls)
{
    PyObject *fields = PyType_Check(cls) ? PyObject_GetAttrString(cls, "_fields") : NULL;
    Py_ssize_t n = fields != NULL && PyTuple_Check(fields) ? PyTuple_GET_SIZE(fields) : -1;
    Py_XDECREF(fields);
    PyErr_Clear();
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)
        || n != DETAIL_FIELDS) {
        PyErr_Format(PyExc_TypeError, "set_detail_type() expected a named tuple class of %d "
                     "fields, got %R", DETAIL_FIELDS, cls);
        return NULL;
    }
    Py_INCREF(cls);
    Py_XSETREF(detail_type, (PyTypeObject *)cls);
    Py_RETURN_NONE;
}

/* ``t`` (a new reference, or NULL) as a detail: tuple.__new__(Detail, t), what the class's own
 * constructor ends in, without its Python frame. */
static PyObject *
as_detail(PyObject *t)
{
    if (t == NULL || detail_type == NULL)
        return t;
    PyObject *args = PyTuple_Pack(1, t);
    Py_DECREF(t);
    if (args == NULL)
        return NULL;
    PyObject *d = PyTuple_Type.tp_new(detail_type, args, NULL);
    Py_DECREF(args);
    return d;
}

static PyObject *
slot_detail(Slot *s, int nph, int traced, int32_t ck)
{
    PyObject *ts = int64_list(s->ts, nph + 1);
    if (ts == NULL)
        return NULL;
    PyObject *acc, *draft;
    int native = s->nseq >= 0;
    if (native) {
        acc = PyList_New(s->nseq);
        if (acc == NULL) {
            Py_DECREF(ts);
            return NULL;
        }
        for (int32_t i = 0; i < s->nseq; i++)
            PyList_SET_ITEM(acc, i, PyLong_FromLong(s->lens[i])); /* small ints: cached */
        draft = PyLong_FromLong(s->k);
    }
    else {
        acc = s->acc ? s->acc : Py_None;
        Py_INCREF(acc);
        draft = s->draft ? s->draft : Py_None;
        Py_INCREF(draft);
    }
    PyObject *batch;
    if (s->batch_obj != NULL) {
        batch = s->batch_obj;
        Py_INCREF(batch);
    }
    else if (s->batch >= 0)
        batch = PyLong_FromLongLong(s->batch);
    else {
        batch = Py_None;
        Py_INCREF(batch);
    }
    /* specobs._ring.Detail: (cycle_index, stamps, batch, events, cost_ns, acceptance, draft_length,
     * emitted, copy, native, traced, cycle_k, cycle_k_obj) */
    return as_detail(Py_BuildValue("(LNNOLNNOOiiiO)", (long long)s->idx, ts, batch,
                                   s->ev ? s->ev : Py_None, (long long)s->cost, acc, draft,
                                   s->emitted ? s->emitted : Py_None,
                                   s->copy ? s->copy : Py_None, native, traced, (int)ck,
                                   s->dk_obj ? s->dk_obj : Py_None));
}

/* A read copy's pinned slot back to its free list (what its ``release`` does: a member read
 * and an append, no Python code), else to ``released`` for the resolver. -1 if an append
 * failed. With the GIL. */
static int
copy_back(PyObject *copy, PyObject *released)
{
    PyObject *pool = PyObject_GetAttr(copy, s_free);
    int back = pool != NULL && PyList_CheckExact(pool) ? PyList_Append(pool, copy)
                                                         : PyList_Append(released, copy);
    if (pool == NULL)
        PyErr_Clear();
    Py_XDECREF(pool);
    return back;
}

/* A completed copy of the clock's pinned-buffer type (``copy_type``: its ``ptr``, ``itemsize``
 * and ``length`` are member slots, read with no Python code run), read straight from pinned
 * memory: stored as native acceptance when every value is in 0..k and the draft length is an
 * int (1), else kept as the list of values for the resolver's validation (0); -1 on an error.
 * The copy itself goes back to its pool (its ``_free`` list), or where it has none to
 * ``released`` (the resolver hands it back), either way. */
static int
read_copy(Ring *r, Slot *s, PyObject *released)
{
    PyObject *copy = s->copy;
    void *ptr;
    long isz;
    Py_ssize_t n;
    int rc = -1;
    if (pinned_fields(copy, &ptr, &isz, NULL, &n) < 0 || bad_buffer(ptr, isz, n))
        goto done;
    int64_t k = r->k_max;
    int native = s->emitted == NULL
                 && (s->draft == NULL || exact_int_in(s->draft, 0, r->k_max, &k));
    if (native && n <= NATIVE_MAX_SEQ && ensure_lens(s, n) < 0)
        goto done;
    native = native && n <= NATIVE_MAX_SEQ;
    int64_t sum = 0;
    for (Py_ssize_t i = 0; native && i < n; i++) {
        int64_t v = element_at(ptr, isz, i);
        if (v < 0 || v > k)
            native = 0;
        else {
            s->lens[i] = (uint8_t)v;
            sum += v;
        }
    }
    if (native) {
        s->nseq = (int32_t)n;
        s->k = (int32_t)k;
        s->accsum = sum;
        s->has_obj_acc = 0;
        drop_ref(&s->draft);
        rc = 1;
    }
    else {
        PyObject *values = PyList_New(n);
        if (values == NULL)
            goto done;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *o = PyLong_FromLongLong(element_at(ptr, isz, i));
            if (o == NULL) {
                Py_DECREF(values);
                goto done;
            }
            PyList_SET_ITEM(values, i, o);
        }
        Py_XSETREF(s->acc, values);
        rc = 0;
    }
done:
    if (rc < 0)
        return rc; /* the copy stays: the resolver reads it in Python and reports why not */
    /* Read: the slot goes back to its free list here, else to the resolver. */
    if (copy_back(copy, released) < 0)
        return -1;
    drop_ref(&s->copy);
    return rc;
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

/* A sampled cycle's GPU phase times through the runtime (every event of it completed: the
 * poll's bound says so), as the clock's ``elapsed_ns`` reads them: milliseconds as a float,
 * rounded half to even to integer ns. Calls no Python API. -1 when the runtime refuses one
 * or a time is negative (the resolver reads those in Python, and says why). */
static int
read_gpu(Ring *r, const Slot *s, int64_t *g, int64_t *sum)
{
    int64_t tot = 0;
    for (int i = 0; i < r->nph; i++) {
        float ms = 0.0f;
        if (r->ne_elapsed(&ms, (void *)(uintptr_t)s->evh[i], (void *)(uintptr_t)s->evh[i + 1])
            != 0) {
            if (r->ne_lasterr != NULL)
                r->ne_lasterr(); /* not left for the engine's next launch check */
            return -1;
        }
        double ns = nearbyint((double)ms * 1e6);
        if (!(ns >= 0.0 && ns < 9.0e18))
            return -1;
        g[i] = (int64_t)ns;
        tot += g[i];
    }
    *sum = tot;
    return 0;
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

/* The drain itself: consume the done cycles with index < bound, at most ``limit``, into ``t``;
 * append the cycles that need Python to ``details`` and the copies read here to ``released``.
 * Makes no call into Python (the worker cannot run in between). Sets the cycles taken and the
 * sum of their host cycle times; -1 on an error. */
static int
drain_loop(Ring *r, Totals *t, long long bound, Py_ssize_t limit, PyObject *trace,
           long long slow_ns, int want_all, PyObject *details, PyObject *released,
           Py_ssize_t *n_out, int64_t *total_out, int yield_to_walk, int nev)
{
    int nph = r->nph;
    int64_t total = 0;
    Py_ssize_t n = 0, ti = 0, nt = PyList_GET_SIZE(trace);
    while (r->tail != r->head && n < limit) {
        Slot *s = &r->slots[r->tail % (uint64_t)r->nslots];
        /* drain_into: the walk without the GIL takes over again at the next cycle it can
         * take, once this drain took one (so every round takes at least one). */
        if (yield_to_walk && n > 0 && STATE(s) == SLOT_DONE && LOADN(&r->waiting) >= NOGIL_MIN
            && walkable(r, s, nev))
            break;
        if (STATE(s) == SLOT_VOID) {
            slot_drop_held(r, s);
            slot_clear_objs(r, s);
            STORE64(&r->tail, r->tail + 1);
            continue;
        }
        if (STATE(s) != SLOT_DONE || s->idx >= bound)
            break;
        ADDN(&r->nheld, -(Py_ssize_t)(s->ev != NULL || s->copy != NULL));
        int64_t tot = add_host(r, t, s->ts);
        total += tot;
        add_gap(r, t, s);
        int py_batch = 0;
        if (s->copy != NULL && s->nseq < 0 && s->acc == NULL && r->copy_type != Py_None
            && (PyObject *)Py_TYPE(s->copy) == r->copy_type) {
            if (read_copy(r, s, released) < 0)
                PyErr_Clear();
        }
        add_acceptance(t, s);
        int32_t ck = slot_cycle_k(s);
        add_by_k(r, t, s);
        if (s->batch_obj != NULL || s->has_obj_acc)
            py_batch = 1; /* sized by the resolver's validation */
        else
            add_batch(r, t, s);
        int traced = 0;
        while (ti < nt) {
            long long want = PyLong_AsLongLong(PyList_GET_ITEM(trace, ti));
            if (want == -1 && PyErr_Occurred())
                return -1;
            if (want > s->idx)
                break;
            ti++;
            if (want == s->idx)
                traced = 1;
        }
        if (slow_ns >= 0 && s->ev == NULL && tot >= slow_ns) /* GPU-timed: by GPU time */
            traced = 1;
        /* drain_into, on the thread the runtime reads on: a sampled cycle that needs Python
         * for nothing else has its GPU times read here, into the totals, and its events go
         * back to the resolver to release (a slow one stays a detail: it is traced). */
        int gpu_read = 0;
        if (nev && s->ev != NULL && s->evn == nph + 1 && !want_all && !traced && !py_batch
            && s->copy == NULL && s->acc == NULL && s->emitted == NULL && s->dk_obj == NULL) {
            int64_t g[MAX_PHASES], gsum;
            if (read_gpu(r, s, g, &gsum) == 0 && !(slow_ns >= 0 && gsum >= slow_ns)
                && PyList_Append(released, s->ev) == 0) {
                add_gpu(r, t, g, gsum);
                r->ne_cycles++;
                r->ne_cost += s->cost;
                gpu_read = 1;
            }
            PyErr_Clear();
        }
        if (want_all || traced || py_batch || (s->ev != NULL && !gpu_read) || s->copy != NULL
            || s->acc != NULL || s->emitted != NULL || s->dk_obj != NULL) {
            PyObject *d = slot_detail(s, nph, traced, ck);
            if (d == NULL || PyList_Append(details, d) < 0) {
                Py_XDECREF(d);
                return -1;
            }
            Py_DECREF(d);
        }
        /* The resolver owns what the details reference now. */
        drop_ref(&s->ev);
        drop_ref(&s->copy);
        slot_clear_objs(r, s);
        STATE_SET(s, SLOT_VOID);
        STORE64(&r->tail, r->tail + 1);
        ADDN(&r->waiting, -1);
        n++;
    }
    *n_out = n;
    *total_out = total;
    return 0;
}


/* -- the drain without the GIL -------------------------------------------------------------- */


static inline int64_t
thread_cpu_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* One value of a native copy's pinned buffer. */
static inline int64_t
copy_value(const Slot *s, int32_t i)
{
    if (s->cisz == 8) {
        int64_t v;
        memcpy(&v, (const char *)s->cptr + 8 * (size_t)i, 8);
        return v;
    }
    int32_t x;
    memcpy(&x, (const char *)s->cptr + 4 * (size_t)i, 4);
    return x;
}

/* Whether the walk takes this done cycle: the same question before the GIL is let go (so it is
 * let go only for a walk that takes one at least) and during the walk. Reads the slot, a
 * native copy's pinned buffer and, given ``g``, a sampled cycle's GPU times into it. */
static int
walk_takes(Ring *r, Slot *s, int64_t bound, int64_t next_trace, int64_t slow_ns, int nev,
           int64_t *g, int64_t *gsum)
{
    if (!walkable(r, s, nev) || s->idx >= bound || s->idx >= next_trace)
        return 0;
    if (s->ev != NULL) { /* sampled: its GPU times (g NULL: not read), and slow by those */
        if (g != NULL && (read_gpu(r, s, g, gsum) < 0 || (slow_ns >= 0 && *gsum >= slow_ns)))
            return 0;
    }
    else if (slow_ns >= 0 && s->ts[r->nph] - s->ts[0] >= slow_ns)
        return 0; /* traced as slow */
    for (int32_t i = 0; s->copy != NULL && i < s->clen; i++) {
        int64_t v = copy_value(s, i);
        if (v < 0 || v > s->ck)
            return 0; /* out of range: the resolver's validation says which */
    }
    return 1;
}

/* What the walk parks for the caller to hand back once it holds the GIL again: the copies it
 * read, their draft-length objects, the sampled cycles' event lists (references moved here). */
typedef struct {
    PyObject **copies, **drafts, **events;
    Py_ssize_t ncopies, ndrafts, nevents, nheld;
    PyObject **cpools; /* each copy's pool, when the pump parks (else NULL) */
} Parked;

/* The drain's common case, walked with the GIL let go and the ring's lock held: the done
 * cycles from the tail that ``walk_takes`` -- nothing but numbers (stamps, a batch size,
 * acceptance stored natively), a completed native CUDA acceptance copy (index < bound) of the
 * clock's pinned type with every value in 0..its draft length, a sampled cycle whose events'
 * handles it has (``nev``: their times are read here, on the thread the runtime was set up
 * for) -- stopping at the first cycle that needs Python: events it cannot read, objects kept
 * for validation, a copy it cannot read, a cycle picked for a trace (``next_trace``) or slow
 * (``slow_ns``: by GPU time when sampled), an open slot. Adds to ``t`` exactly what drain_loop
 * would. Calls no Python API and touches no reference count: a copy read here, its
 * draft-length object and a sampled cycle's event list are parked in ``pk`` (their references
 * moved there) for the caller to hand back once it holds the GIL again; a slot's length buffer
 * grows with the raw allocator, which needs no GIL. Returns the cycles taken; ``*total_out``
 * is the sum of their host cycle times. */
static Py_ssize_t
walk_nogil(Ring *r, Totals *t, int64_t bound, Py_ssize_t limit, int64_t next_trace,
           int64_t slow_ns, int nev, Parked *pk, int64_t *total_out)
{
    Py_ssize_t n = 0;
    int64_t total = 0;
    uint64_t head = LOAD64(&r->head);
    while (r->tail != head && n < limit) {
        Slot *s = &r->slots[r->tail % (uint64_t)r->nslots];
        int st = STATE(s);
        if (st == SLOT_VOID) {
            if (s->ev || s->acc || s->emitted || s->batch_obj || s->copy || s->draft
                || s->dk_obj)
                break; /* its references are let go of with the GIL */
            STORE64(&r->tail, r->tail + 1);
            continue;
        }
        int64_t g[MAX_PHASES], gsum = 0;
        if (st != SLOT_DONE || !walk_takes(r, s, bound, next_trace, slow_ns, nev, g, &gsum))
            break;
        pk->nheld += s->ev != NULL || s->copy != NULL;
        if (s->copy != NULL) {
            int32_t m = s->clen;
            if (m > s->lcap) {
                int32_t cap = s->lcap ? s->lcap : 16;
                while (cap < m)
                    cap *= 2;
                uint8_t *p = PyMem_RawRealloc(s->lens, (size_t)cap);
                if (p == NULL) {
                    pk->nheld -= 1;
                    break; /* the drain with the GIL reads it, and reports the memory */
                }
                s->lens = p;
                s->lcap = cap;
            }
            int64_t sum = 0;
            for (int32_t i = 0; i < m; i++) {
                int64_t v = copy_value(s, i);
                s->lens[i] = (uint8_t)v;
                sum += v;
            }
            s->nseq = m;
            s->k = s->ck;
            s->accsum = sum;
            s->has_obj_acc = 0;
            if (pk->cpools != NULL)
                pk->cpools[pk->ncopies] = s->cpool;
            pk->copies[pk->ncopies++] = s->copy;
            s->copy = NULL;
            s->cptr = NULL;
            if (s->draft != NULL) {
                pk->drafts[pk->ndrafts++] = s->draft;
                s->draft = NULL;
            }
        }
        if (s->ev != NULL) {
            add_gpu(r, t, g, gsum);
            r->ne_cycles++;
            r->ne_cost += s->cost;
            pk->events[pk->nevents++] = s->ev;
            s->ev = NULL;
            s->evn = 0;
        }
        total += add_host(r, t, s->ts);
        add_gap(r, t, s);
        add_acceptance(t, s);
        add_by_k(r, t, s);
        add_batch(r, t, s);
        STATE_SET(s, SLOT_VOID);
        STORE64(&r->tail, r->tail + 1);
        n++;
    }
    *total_out = total;
    return n;
}

/* Back under the GIL, what a walk parked: the copies read go back to their pools (what their
 * ``release`` does), else to the resolver (``released``); the events to the resolver, which
 * releases them to the clock; the draft lengths are let go of. -1 if an append failed (every
 * reference is let go of either way). */
static int
unpark(Parked *pk, PyObject *released)
{
    int rc = 0;
    for (Py_ssize_t i = 0; i < pk->ncopies; i++) {
        PyObject *copy = pk->copies[i];
        if (copy_back(copy, released) < 0)
            rc = -1;
        Py_DECREF(copy);
    }
    for (Py_ssize_t i = 0; i < pk->nevents; i++) {
        if (PyList_Append(released, pk->events[i]) < 0)
            rc = -1;
        Py_DECREF(pk->events[i]);
    }
    for (Py_ssize_t i = 0; i < pk->ndrafts; i++)
        Py_DECREF(pk->drafts[i]);
    pk->ncopies = pk->nevents = pk->ndrafts = 0;
    return rc;
}

/* The pump's parking as a Parked (its counts copied in; ``cpools``: where the walk notes each
 * copy's pool, NULL where nobody reads them back). */
static inline Parked
parking_of(Ring *r, PyObject **cpools)
{
    Parked pk = {r->pk_buf, r->pk_buf + PARK_CAP, r->pk_buf + 2 * PARK_CAP,
                 r->pk_ncopies, r->pk_ndrafts, r->pk_nevents, 0, cpools};
    return pk;
}

/* With the GIL, before a walk: the runtime's handles of the waiting sampled cycles' events
 * (at most ``limit`` from the tail), read from the event objects. Reading an attribute may run
 * Python code, during which the worker may reuse a slot: a handle is kept only if its slot
 * still holds the same events of the same cycle afterwards. */
/* An event object's handle (its ``cuda_event``): from the cache, else read (which may run
 * Python) and kept. 0 when it has none. With the GIL. */
static uint64_t
handle_cached(const Ring *r, PyObject *ev)
{
    size_t mask = HANDLE_CACHE - 1;
    for (size_t i = ((uintptr_t)ev >> 4) & mask; r->hc_key != NULL; i = (i + 1) & mask) {
        if (r->hc_key[i] == ev)
            return r->hc_val[i];
        if (r->hc_key[i] == NULL)
            break;
    }
    return 0;
}

static uint64_t
handle_of(Ring *r, PyObject *ev)
{
    uint64_t cached = handle_cached(r, ev);
    if (cached != 0)
        return cached;
    size_t mask = HANDLE_CACHE - 1, h = ((uintptr_t)ev >> 4) & mask;
    PyObject *o = PyObject_GetAttr(ev, s_cuda_event);
    unsigned long long v = o != NULL ? PyLong_AsUnsignedLongLong(o) : 0;
    Py_XDECREF(o);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (v == 0 || 2 * (r->hc_n + 1) > HANDLE_CACHE)
        return v; /* full (at half, for short probes): read each time from here on */
    if (r->hc_key == NULL) {
        r->hc_key = PyMem_Calloc(HANDLE_CACHE, sizeof(PyObject *));
        r->hc_val = PyMem_Calloc(HANDLE_CACHE, sizeof(uint64_t));
        if (r->hc_key == NULL || r->hc_val == NULL) {
            PyMem_Free(r->hc_key);
            PyMem_Free(r->hc_val);
            r->hc_key = NULL;
            r->hc_val = NULL;
            return v;
        }
    }
    size_t i = h; /* probed again: the read above may have run Python that changed the table */
    while (r->hc_key[i] != NULL && r->hc_key[i] != ev)
        i = (i + 1) & mask;
    if (r->hc_key[i] == NULL) {
        Py_INCREF(ev);
        r->hc_key[i] = ev;
        r->hc_n++;
    }
    r->hc_val[i] = v;
    return v;
}

static void
fill_handles(Ring *r, Py_ssize_t limit)
{
    int nph = r->nph;
    /* From where the last call stopped: slots end in order, so the done ones before it were
     * looked at (an open or deferred slot stops the scan until it is done). */
    uint64_t p = r->fill_pos > r->tail ? r->fill_pos : r->tail;
    for (Py_ssize_t i = 0; i < limit && p != r->head; i++, p++) {
        Slot *s = &r->slots[p % (uint64_t)r->nslots];
        int st = STATE(s);
        if (st != SLOT_DONE && st != SLOT_VOID)
            break;
        r->fill_pos = p + 1;
        if (s->ev == NULL || s->evn != 0 || st != SLOT_DONE)
            continue;
        PyObject *ev = s->ev;
        int64_t idx = s->idx;
        uint64_t h[MAX_PHASES + 1];
        int32_t got = PyList_CheckExact(ev) && PyList_GET_SIZE(ev) == nph + 1 ? nph + 1 : -1;
        Py_INCREF(ev);
        for (int j = 0; got > 0 && j <= nph; j++) {
            uint64_t v = handle_of(r, PyList_GET_ITEM(ev, j));
            if (v == 0)
                got = -1;
            else
                h[j] = v;
            if (PyList_GET_SIZE(ev) != nph + 1)
                got = -1;
        }
        if (s->ev == ev && s->idx == idx && STATE(s) == SLOT_DONE) {
            if (got > 0)
                memcpy(s->evh, h, sizeof(uint64_t) * (size_t)got);
            s->evn = got;
        }
        Py_DECREF(ev);
    }
}

/* The walk above for drain_into, when enough cycles wait and the first one is for it: the GIL
 * let go for the walk, the parked references handed back after. Returns the cycles taken, or -1
 * on an error (the walk itself cannot fail; allocating its parking can). */
static Py_ssize_t
drain_nogil(Ring *r, long long bound, Py_ssize_t limit, PyObject *trace, long long slow_ns,
            int nev, PyObject *released, int64_t *total_out)
{
    *total_out = 0;
    Py_ssize_t cap = limit < LOADN(&r->waiting) ? limit : LOADN(&r->waiting);
    if (cap < NOGIL_MIN)
        return 0;
    /* Is the first waiting cycle one the walk takes? (Else the GIL would be let go for
     * nothing.) */
    Slot *first = NULL;
    for (uint64_t p = r->tail; p != r->head; p++) {
        Slot *s = &r->slots[p % (uint64_t)r->nslots];
        if (STATE(s) != SLOT_VOID) {
            first = s;
            break;
        }
        if (s->ev || s->copy || s->acc || s->draft || s->emitted || s->batch_obj || s->dk_obj)
            return 0;
    }
    if (first == NULL || STATE(first) != SLOT_DONE)
        return 0;
    int64_t next_trace = INT64_MAX;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(trace); i++) {
        long long want = PyLong_AsLongLong(PyList_GET_ITEM(trace, i));
        if (want == -1 && PyErr_Occurred())
            return -1;
        if (want >= first->idx) {
            next_trace = want; /* sorted: the first at or after the walk's start */
            break;
        }
    }
    /* A sampled first cycle's times are read by the walk, not here with the GIL held: one
     * slow by its GPU time (traced) makes this walk take nothing, which is rare. */
    if (!walk_takes(r, first, bound, next_trace, slow_ns, nev, NULL, NULL))
        return 0;
    PyObject **park = PyMem_Malloc(sizeof(PyObject *) * 3 * (size_t)cap);
    if (park == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Parked pk = {park, park + cap, park + 2 * cap, 0, 0, 0, 0, NULL};
    Py_ssize_t n;
    int64_t total = 0, cpu;
    lock_made(r); /* here, with the GIL: a new lock after a fork is made by one thread */
    Py_BEGIN_ALLOW_THREADS
    cpu = thread_cpu_ns();
    if (r->walk_count == 0)
        r->walk_cpu_out = cpu;
    else if (cpu - r->walk_cpu_in > r->walk_hold_ns)
        r->walk_hold_ns = cpu - r->walk_cpu_in;
    r->walk_count++;
    pthread_mutex_lock(&r->mu); /* made already (lock_made, with the GIL) */
    n = walk_nogil(r, r->totals, bound, cap, next_trace, slow_ns, nev, &pk, &total);
    ring_unlock(r);
    r->walk_cpu_in = thread_cpu_ns();
    cpu = r->walk_cpu_in - cpu;
    Py_END_ALLOW_THREADS
    ADDN(&r->waiting, -n);
    ADDN(&r->nheld, -pk.nheld);
    r->nogil_cycles += n;
    r->nogil_walks++;
    r->nogil_ns += cpu;
    int rc = unpark(&pk, released);
    PyMem_Free(park);
    *total_out = total;
    return rc < 0 ? -1 : n;
}

static int
drain_args(PyObject *const *args, Py_ssize_t nargs, long long *bound, Py_ssize_t *limit,
           long long *slow_ns, int *want_all)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "drain(bound, limit, trace, slow_ns, want_all)");
        return -1;
    }
    *bound = PyLong_AsLongLong(args[0]);
    *limit = PyLong_AsSsize_t(args[1]);
    *slow_ns = PyLong_AsLongLong(args[3]);
    *want_all = PyObject_IsTrue(args[4]);
    if (PyErr_Occurred())
        return -1;
    if (!PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "trace must be a list of cycle indices");
        return -1;
    }
    return 0;
}

/* ``d[k] = v`` with int keys and values; -1 on an error. */
static int
dict_set_ll(PyObject *d, long k, long long v)
{
    PyObject *kk = PyLong_FromLong(k), *vv = PyLong_FromLongLong(v);
    int rc = kk == NULL || vv == NULL ? -1 : PyDict_SetItem(d, kk, vv);
    Py_XDECREF(kk);
    Py_XDECREF(vv);
    return rc;
}

/* specobs._ring.ByDraftLength of ``t``: ({cycle k: cycles}, {cycle k: [host ns per phase]},
 * {cycle k: emitted}, {sequence k: accepted}, {cycle k: sequences}), only the lengths seen, in
 * order. */
static PyObject *
by_k_tuple(Ring *r, const Totals *t)
{
    int w = r->k_max + 1, nph = r->nph;
    PyObject *kc = PyDict_New(), *kh = PyDict_New(), *ke = PyDict_New(), *ka = PyDict_New();
    PyObject *kb = PyDict_New();
    if (kc == NULL || kh == NULL || ke == NULL || ka == NULL || kb == NULL)
        goto fail;
    for (int k = 0; k < w; k++) {
        if (t->kseen[k] && dict_set_ll(ka, k, t->kacc[k]) < 0)
            goto fail;
        if (t->kcycles[k] == 0)
            continue;
        PyObject *kk = PyLong_FromLong(k);
        PyObject *h = int64_list(&t->khost[k * MAX_PHASES], nph);
        int rc = kk == NULL || h == NULL ? -1 : PyDict_SetItem(kh, kk, h);
        Py_XDECREF(kk);
        Py_XDECREF(h);
        if (rc < 0 || dict_set_ll(kc, k, t->kcycles[k]) < 0
            || dict_set_ll(ke, k, t->kemitted[k]) < 0 || dict_set_ll(kb, k, t->kbatch[k]) < 0)
            goto fail;
    }
    return Py_BuildValue("(NNNNN)", kc, kh, ke, ka, kb);
fail:
    Py_XDECREF(kc);
    Py_XDECREF(kh);
    Py_XDECREF(ke);
    Py_XDECREF(ka);
    Py_XDECREF(kb);
    return NULL;
}

/* ([(counts, sum)] per phase then the cycle, length counts, accepted, drafted, emitted,
 *  {draft length: sequences}, batch (counts, sum), batch count) of ``t``. */
static PyObject *
totals_tuple(Ring *r, const Totals *t)
{
    int nph = r->nph, nb = r->ndb + 1, nbb = r->nbb + 1, w = r->k_max + 1;
    PyObject *hl = PyList_New(nph + 1);
    if (hl == NULL)
        return NULL;
    for (int i = 0; i <= nph; i++) {
        PyObject *b = bucketed(&t->host[i * nb], nb, t->hsum[i]);
        if (b == NULL) {
            Py_DECREF(hl);
            return NULL;
        }
        PyList_SET_ITEM(hl, i, b);
    }
    PyObject *kd = PyDict_New();
    if (kd == NULL) {
        Py_DECREF(hl);
        return NULL;
    }
    for (int k = 0; k < w; k++) {
        if (!t->kseen[k])
            continue;
        PyObject *kk = PyLong_FromLong(k), *vv = PyLong_FromLongLong(t->kseq[k]);
        if (kk == NULL || vv == NULL || PyDict_SetItem(kd, kk, vv) < 0) {
            Py_XDECREF(kk);
            Py_XDECREF(vv);
            Py_DECREF(kd);
            Py_DECREF(hl);
            return NULL;
        }
        Py_DECREF(kk);
        Py_DECREF(vv);
    }
    PyObject *lc = int64_list(t->lcounts, w);
    PyObject *bc = bucketed(t->bcounts, nbb, t->bsum);
    if (lc == NULL || bc == NULL) {
        Py_XDECREF(lc);
        Py_XDECREF(bc);
        Py_DECREF(kd);
        Py_DECREF(hl);
        return NULL;
    }
    return Py_BuildValue("(NNLLLNNL)", hl, lc, (long long)t->accepted, (long long)t->drafted,
                         (long long)t->emitted, kd, bc, (long long)t->bn);
}

/* Resolve the queued cycles with index < bound, at most ``limit``, as one chunk. Returns
 * (cycles, host [(counts, sum) per phase, then the cycle], total ns, last end stamp or None,
 *  length counts, accepted, drafted, emitted, {draft length: sequences}, batch (counts, sum),
 *  batch count, details, copies read here for the resolver to release)
 * where details are the cycles that need Python: events, a copy, values kept as objects, traced
 * (index in ``trace``, a sorted list, or a host cycle time >= slow_ns), or all when want_all.
 * Their host times and native acceptance are in the totals already. */
static PyObject *
drain_walked(Ring *r, PyObject *const *args, Py_ssize_t nargs)
{
    long long bound, slow_ns;
    Py_ssize_t limit, n = 0;
    int want_all;
    int64_t total = 0;
    if (drain_args(args, nargs, &bound, &limit, &slow_ns, &want_all) < 0)
        return NULL;
    Totals *t = PyMem_Calloc(1, sizeof(Totals));
    PyObject *details = PyList_New(0), *released = PyList_New(0), *out = NULL;
    if (t == NULL || details == NULL || released == NULL) {
        if (t == NULL)
            PyErr_NoMemory();
        goto done;
    }
    Deferral d;
    defer_begin(&d);
    int rc = drain_loop(r, t, bound, limit, args[2], slow_ns, want_all, details, released, &n,
                        &total, 0, 0);
    defer_end(&d);
    if (rc < 0)
        goto done;
    PyObject *tt = totals_tuple(r, t);
    if (tt == NULL)
        goto done;
    PyObject *lastobj = n ? PyLong_FromLongLong(t->last) : (Py_INCREF(Py_None), Py_None);
    if (lastobj == NULL) {
        Py_DECREF(tt);
        goto done;
    }
    PyObject *bk = by_k_tuple(r, t);
    if (bk == NULL) {
        Py_DECREF(tt);
        Py_DECREF(lastobj);
        goto done;
    }
    PyObject *gap = bucketed(t->gap, r->ndb + 1, t->gapsum);
    if (gap == NULL) {
        Py_DECREF(tt);
        Py_DECREF(lastobj);
        Py_DECREF(bk);
        goto done;
    }
    /* tt: host, lengths, accepted, drafted, emitted, kseq, batch, batch count */
    out = Py_BuildValue("(nOLNOOOOOOOOONNL)", n, PyTuple_GET_ITEM(tt, 0), (long long)total,
                        lastobj, PyTuple_GET_ITEM(tt, 1), PyTuple_GET_ITEM(tt, 2),
                        PyTuple_GET_ITEM(tt, 3), PyTuple_GET_ITEM(tt, 4),
                        PyTuple_GET_ITEM(tt, 5), PyTuple_GET_ITEM(tt, 6),
                        PyTuple_GET_ITEM(tt, 7), details, released, bk, gap,
                        (long long)t->idle);
    Py_DECREF(tt);
done:
    PyMem_Free(t);
    Py_XDECREF(details);
    Py_XDECREF(released);
    return out;
}

/* The same drain into the ring's running totals (read with ``totals``): the resolver's path,
 * which hands the aggregation nothing for the cycles that need no Python. Returns
 * (cycles, total ns, details, copies read here to release). */
static PyObject *
drain_into_walked(Ring *r, PyObject *const *args, Py_ssize_t nargs)
{
    long long bound, slow_ns;
    Py_ssize_t limit, n = 0;
    int want_all;
    int64_t total = 0;
    if (drain_args(args, nargs, &bound, &limit, &slow_ns, &want_all) < 0)
        return NULL;
    PyObject *details = PyList_New(0), *released = PyList_New(0), *out = NULL;
    int rc = details != NULL && released != NULL ? 0 : -1;
    int walk = !want_all;
    /* What the pump walked since the last call (its cycles are in the totals already), and the
     * references it parked, handed back now: counted in this drain's cycles and host time. */
    Py_ssize_t pumped = (Py_ssize_t)r->pump_cycles;
    int64_t pumped_ns = r->pump_total;
    r->pump_cycles = r->pump_total = 0;
    if (rc == 0 && r->pk_buf != NULL) {
        Parked pk = parking_of(r, NULL);
        r->pk_ncopies = r->pk_ndrafts = r->pk_nevents = 0;
        if (unpark(&pk, released) < 0)
            PyErr_Clear(); /* a reference not handed back is let go of: its pool is smaller */
    }
    /* Sampled cycles' GPU times are read natively only on the thread the clock set up for
     * them (the resolver's: its current device is the clock's). */
    int nev = r->ne_elapsed != NULL && r->ne_thread == PyThread_get_thread_ident();
    r->walk_count = r->walk_hold_ns = 0;
    /* Only the cycles begun before this call: one a finalizer run between two rounds begins
     * waits for the next drain, as it does when the drain is one pass. */
    if (bound > r->begun)
        bound = r->begun;
    /* Rounds: the walk without the GIL takes the common case, the drain with it the cycles that
     * need Python, until the chunk is full or nothing more is ready. */
    while (rc == 0 && n < limit) {
        int64_t wtotal = 0, gtotal = 0;
        if (nev && LOADN(&r->nheld) > 0)
            fill_handles(r, limit - n);
        Py_ssize_t nw = walk ? drain_nogil(r, bound, limit - n, args[2], slow_ns, nev, released,
                                           &wtotal) : 0;
        if (nw < 0) {
            nw = 0;
            PyErr_Clear(); /* nothing was walked: the drain below takes the cycles instead */
        }
        n += nw;
        total += wtotal;
        if (n >= limit)
            break;
        Py_ssize_t ng = 0;
        Deferral d;
        defer_begin(&d);
        rc = drain_loop(r, r->totals, bound, limit - n, args[2], slow_ns, want_all, details,
                        released, &ng, &gtotal, walk, nev);
        defer_end(&d);
        n += ng;
        total += gtotal;
        if (ng == 0)
            break;
    }
    n += pumped;
    total += pumped_ns;
    if (rc == 0)
        out = Py_BuildValue("(nLOO)", n, (long long)total, details, released);
    r->drained += n;
    Py_XDECREF(details);
    Py_XDECREF(released);
    return out;
}

/* -- the pump ------------------------------------------------------------------------------ */

/* Whether entry ``i`` of the pump's parking holds a reference (the counts say how many of each
 * kind; entries past them are stale). */
static inline int
parked_at(const Ring *r, Py_ssize_t i)
{
    Py_ssize_t kind = i / PARK_CAP, j = i % PARK_CAP;
    return j < (kind == 0 ? r->pk_ncopies : kind == 1 ? r->pk_ndrafts : r->pk_nevents);
}

static PyObject *s_pump_woken, *s_pump_python, *s_pump_expire, *s_pump_parked, *s_pump_counts,
    *s_pump_writer, *s_pump_tick;

/* Without the GIL: a sampled cycle's event handles from the ring's cache, where every one of its
 * events is there (the clock's pool is fixed: after the first cycles, all are). Else the slot
 * is left for fill_handles, with the GIL. Reads the event list's items, which nobody writes
 * while the slot holds it, and the cache, which only the resolver's thread writes (with the GIL,
 * outside pump()). */
static void
handles_cached(Ring *r, Slot *s)
{
    PyObject *ev = s->ev;
    int nph = r->nph;
    if (r->hc_key == NULL || !PyList_CheckExact(ev) || PyList_GET_SIZE(ev) != nph + 1)
        return;
    uint64_t h[MAX_PHASES + 1];
    for (int j = 0; j <= nph; j++)
        if ((h[j] = handle_cached(r, PyList_GET_ITEM(ev, j))) == 0)
            return;
    memcpy(s->evh, h, sizeof(uint64_t) * (size_t)(nph + 1));
    s->evn = nph + 1;
}

/* One pass of the pump, with the ring's lock held and the GIL let go: from the tail, every done
 * cycle whose GPU work completed -- a sampled one asked through the runtime (cudaEventQuery on
 * its last event), a native copy by its values landed -- that walk_nogil takes. NULL when it
 * caught up or waits (for the GPU, an open or a deferred cycle); else why Python is needed: a
 * cycle the walk does not take (traced, slow, kept objects, values out of range, handles not
 * cached, an event that reports an error, a copy that never lands), a deferred cycle past its
 * settle timeout (the resolver's expire), or the parking full. */
static PyObject *
pump_walk(Ring *r, int64_t next_trace, int64_t slow_ns, int64_t settle_ns, int nev)
{
    int nph = r->nph;
    for (;;) {
        if (r->tail == LOAD64(&r->head))
            return NULL;
        Slot *s = &r->slots[r->tail % (uint64_t)r->nslots];
        int st = STATE(s);
        if (st == SLOT_OPEN)
            return NULL;
        if (st == SLOT_DEFERRED) {
            /* Every done cycle waits behind it (the walk took those before): expire's rule. */
            int64_t now = r->tick ? r->fake_now : now_ns();
            int late = settle_ns >= 0 && now - s->ts[nph] >= settle_ns;
            return late || LOADN(&r->waiting) >= r->settle_backlog ? s_pump_expire : NULL;
        }
        if (st == SLOT_VOID) {
            if (s->ev || s->acc || s->emitted || s->batch_obj || s->copy || s->draft
                || s->dk_obj)
                return s_pump_python; /* references let go of with the GIL */
            STORE64(&r->tail, r->tail + 1);
            continue;
        }
        if (s->ev != NULL) { /* its last event completed: so did everything before it */
            if (!nev)
                return s_pump_python;
            if (s->evn == 0)
                handles_cached(r, s);
            if (s->evn != nph + 1)
                return s_pump_python;
            int q = r->ne_query((void *)(uintptr_t)s->evh[nph]);
            if (q != 0) {
                if (r->ne_lasterr != NULL)
                    r->ne_lasterr(); /* not left for the engine to find */
                return q == 600 ? NULL : s_pump_python; /* cudaErrorNotReady: not yet */
            }
            if (r->pk_nevents >= (r->park_events < PARK_CAP ? r->park_events : PARK_CAP))
                return s_pump_parked;
        }
        else if (s->copy != NULL) {
            if (s->cptr == NULL || (s->cisz != 4 && s->cisz != 8))
                return s_pump_python;
            if (!bytes_landed(s->cptr, (size_t)s->cisz, (size_t)s->clen)) {
                r->if_polls = r->if_idx == s->idx ? r->if_polls + 1 : 1;
                r->if_idx = s->idx;
                return r->if_polls >= PUMP_POLLS_BEFORE_PYTHON ? s_pump_python : NULL;
            }
        }
        if (s->copy != NULL
            && (r->pk_ncopies >= (r->park_copies < PARK_CAP ? r->park_copies : PARK_CAP)
                || r->pk_ndrafts >= PARK_CAP))
            return s_pump_parked;
        Parked pk = parking_of(r, r->pk_cpool);
        int64_t total = 0;
        Py_ssize_t n = walk_nogil(r, r->totals, s->idx + 1, 1, next_trace, slow_ns, nev, &pk,
                                  &total);
        r->pk_ncopies = pk.ncopies;
        r->pk_ndrafts = pk.ndrafts;
        r->pk_nevents = pk.nevents;
        if (n == 0)
            return s_pump_python;
        ADDN(&r->waiting, -n);
        ADDN(&r->nheld, -pk.nheld);
        r->pump_cycles += n;
        r->pump_total += total;
        r->pump_walked += n;
        r->nogil_cycles += n;
    }
}

/* pump(poll_ns, next_trace, slow_ns, settle_ns, return_after_ns): the resolver's thread waits,
 * polls and walks here with the GIL let go, a pass every poll_ns or when woken (pump_wake, a
 * ring filling up), and comes back only for what needs Python; returns why (see pump_walk):
 * "woken", "python", "expire", "parked", "counts" (a drop or misuse was counted), "writer" (another
 * thread began a cycle), "tick" (return_after_ns passed; -1: never). next_trace: the first cycle picked for a trace (-1:
 * none); slow_ns, settle_ns: -1 for none. */
static PyObject *
Ring_pump(Ring *r, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "pump(poll_ns, next_trace, slow_ns, settle_ns, return_after_ns)");
        return NULL;
    }
    long long a[5];
    for (int i = 0; i < 5; i++)
        a[i] = PyLong_AsLongLong(args[i]);
    if (PyErr_Occurred())
        return NULL;
    int64_t poll_ns = a[0] < 1000 ? 1000 : a[0], next_trace = a[1] < 0 ? INT64_MAX : a[1];
    int64_t slow_ns = a[2], settle_ns = a[3], after_ns = a[4];
    if (r->slots == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the ring is not initialised");
        return NULL;
    }
    pump_made(r);
    lock_made(r);
    if (r->pumping) {
        PyErr_SetString(PyExc_RuntimeError, "pump() is running on another thread");
        return NULL;
    }
    if (r->pk_buf == NULL) {
        PyObject **cp = PyMem_RawCalloc(PARK_CAP, sizeof(PyObject *));
        r->pk_buf = cp != NULL ? PyMem_RawCalloc(3 * PARK_CAP, sizeof(PyObject *)) : NULL;
        if (r->pk_buf == NULL) {
            PyMem_RawFree(cp);
            return PyErr_NoMemory();
        }
        r->pk_cpool = cp;
    }
    int nev = r->ne_elapsed != NULL && r->ne_query != NULL
              && r->ne_thread == PyThread_get_thread_ident();
    int64_t c0 = r->discarded, c1 = r->dropped_queue_full, c2 = r->unsettled;
    int64_t c3 = r->excepted;
    unsigned long w0 = r->writer;
    PyObject *why = NULL;
    int64_t passes = 0, cpu0, cpu1;
    r->pumping = 1;
    r->pump_calls++;
    Py_BEGIN_ALLOW_THREADS
    cpu0 = thread_cpu_ns();
    pthread_mutex_lock(&r->wk);
    int64_t start = now_ns();
    for (;;) {
        int64_t deadline = now_ns() + poll_ns;
        if (after_ns >= 0 && deadline > start + after_ns)
            deadline = start + after_ns;
        struct timespec ts = {(time_t)(deadline / 1000000000), (long)(deadline % 1000000000)};
        pthread_mutex_lock(&r->pm);
        while (r->pump_flag == 0 && pthread_cond_timedwait(&r->pc, &r->pm, &ts) == 0)
            ;
        int flag = r->pump_flag;
        r->pump_flag = 0;
        pthread_mutex_unlock(&r->pm);
        if (flag & PUMP_RETURN) {
            why = s_pump_woken;
            break;
        }
        if (__atomic_load_n(&r->wk_wanted, __ATOMIC_SEQ_CST) > 0) {
            /* Another thread's drain or poll walks first. A wake or a poll taken with it
             * stays owed (that walker stops at a deferred cycle and never expires it), so
             * the pump walks once more unless it was only asked to yield. */
            pthread_mutex_unlock(&r->wk);
            while (__atomic_load_n(&r->wk_wanted, __ATOMIC_SEQ_CST) > 0) {
                struct timespec pause = {0, 20000};
                nanosleep(&pause, NULL);
            }
            pthread_mutex_lock(&r->wk);
            if (flag == PUMP_YIELD)
                continue;
        }
        pthread_mutex_lock(&r->mu);
        why = pump_walk(r, next_trace, slow_ns, settle_ns, nev);
        pthread_mutex_unlock(&r->mu);
        passes++;
        if (why != NULL)
            break;
        if (__atomic_load_n(&r->discarded, __ATOMIC_RELAXED) != c0
            || __atomic_load_n(&r->dropped_queue_full, __ATOMIC_RELAXED) != c1
            || __atomic_load_n(&r->unsettled, __ATOMIC_RELAXED) != c2
            || __atomic_load_n(&r->excepted, __ATOMIC_RELAXED) != c3) {
            why = s_pump_counts;
            break;
        }
        if (__atomic_load_n(&r->writer, __ATOMIC_RELAXED) != w0) {
            why = s_pump_writer; /* the resolver reads the new thread's times from here on */
            break;
        }
        if (after_ns >= 0 && now_ns() - start >= after_ns) {
            why = s_pump_tick;
            break;
        }
    }
    pthread_mutex_unlock(&r->wk);
    cpu1 = thread_cpu_ns();
    Py_END_ALLOW_THREADS
    r->pumping = 0;
    r->pump_passes += passes;
    r->pump_ns += cpu1 - cpu0;
    r->pump_cpu_in = cpu1;
    return Py_NewRef(why);
}

/* cache_handles(events): read these event objects' handles into the cache now (the clock's
 * pool, when the native reads are set up), so that the pump finds every sampled cycle's
 * handles there from the first cycles on. Returns how many the cache holds. */
static PyObject *
Ring_cache_handles(Ring *r, PyObject *events)
{
    PyObject *seq = PySequence_Fast(events, "cache_handles() takes a sequence of events");
    if (seq == NULL)
        return NULL;
    walker_take(r);
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++)
        handle_of(r, PySequence_Fast_GET_ITEM(seq, i));
    walker_give(r);
    Py_DECREF(seq);
    return PyLong_FromSsize_t(r->hc_n);
}

static PyObject *
Ring_pump_wake(Ring *r, PyObject *Py_UNUSED(ignored))
{
    pump_signal(r, PUMP_RETURN);
    Py_RETURN_NONE;
}

/* The resolver's stages that walk the tail, each with the walker's lock (walker_take): the
 * pump, if one runs, comes back first. */
static PyObject *
Ring_pending(Ring *r, PyObject *arg)
{
    walker_take(r);
    PyObject *out = pending_walked(r, arg);
    walker_give(r);
    return out;
}

#define WALKER_FASTCALL(name, body)                                                           \
    static PyObject *name(Ring *r, PyObject *const *args, Py_ssize_t nargs)                  \
    {                                                                                         \
        walker_take(r);                                                                       \
        PyObject *out = body(r, args, nargs);                                                 \
        walker_give(r);                                                                       \
        return out;                                                                           \
    }
WALKER_FASTCALL(Ring_poll, poll_walked)
WALKER_FASTCALL(Ring_drain, drain_walked)
WALKER_FASTCALL(Ring_drain_into, drain_into_walked)

/* The counts the resolver folds and the sampler reads after each drain, in one call: (discarded,
 * dropped_queue_full, unsettled, native_gpu_cycles, native_gpu_cost, excepted). */
static PyObject *
Ring_counters(Ring *r, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(LLLLLL)", (long long)r->discarded, (long long)r->dropped_queue_full,
                         (long long)r->unsettled, (long long)r->ne_cycles, (long long)r->ne_cost,
                         (long long)r->excepted);
}

/* The running totals of ``drain_into``: (cycles, host, length counts, accepted, drafted,
 * emitted, {draft length: sequences}, batch (counts, sum), batch count, last end stamp or
 * None, GPU [(counts, sum)] per phase then the cycle: the sampled cycles it read itself). */
static PyObject *
Ring_totals(Ring *r, PyObject *Py_UNUSED(ignored))
{
    /* A copy taken under the ring's lock (a walk without the GIL may be adding to them). */
    Totals *t = PyMem_Malloc(sizeof(Totals));
    if (t == NULL)
        return PyErr_NoMemory();
    ring_lock(r);
    memcpy(t, r->totals, sizeof(Totals));
    ring_unlock(r);
    PyObject *tt = totals_tuple(r, t);
    if (tt == NULL) {
        PyMem_Free(t);
        return NULL;
    }
    int nph = r->nph, nb = r->ndb + 1;
    PyObject *gl = PyList_New(nph + 1);
    for (int i = 0; gl != NULL && i <= nph; i++) {
        PyObject *b = bucketed(&t->gpu[i * nb], nb, t->gsum[i]);
        if (b == NULL)
            Py_CLEAR(gl);
        else
            PyList_SET_ITEM(gl, i, b);
    }
    PyObject *bk = gl == NULL ? NULL : by_k_tuple(r, t);
    PyObject *gap = bk == NULL ? NULL : bucketed(t->gap, nb, t->gapsum);
    if (gap == NULL) {
        Py_XDECREF(bk);
        Py_XDECREF(gl);
        Py_DECREF(tt);
        PyMem_Free(t);
        return NULL;
    }
    /* RingTotals: ..., gpu, then the five of ByDraftLength, the gaps and the idle ones */
    PyObject *out = Py_BuildValue(
        "(LOOOOOOOONNOOOOONL)", (long long)t->cycles, PyTuple_GET_ITEM(tt, 0),
        PyTuple_GET_ITEM(tt, 1), PyTuple_GET_ITEM(tt, 2), PyTuple_GET_ITEM(tt, 3),
        PyTuple_GET_ITEM(tt, 4), PyTuple_GET_ITEM(tt, 5), PyTuple_GET_ITEM(tt, 6),
        PyTuple_GET_ITEM(tt, 7),
        t->cycles ? PyLong_FromLongLong(t->last) : (Py_INCREF(Py_None), Py_None), gl,
        PyTuple_GET_ITEM(bk, 0), PyTuple_GET_ITEM(bk, 1), PyTuple_GET_ITEM(bk, 2),
        PyTuple_GET_ITEM(bk, 3), PyTuple_GET_ITEM(bk, 4), gap, (long long)t->idle);
    Py_DECREF(bk);
    Py_DECREF(tt);
    PyMem_Free(t);
    return out;
}

/* The running totals from zero; no gap spans the reset either. */
static PyObject *
Ring_reset_totals(Ring *r, PyObject *Py_UNUSED(ignored))
{
    ring_lock(r);
    memset(r->totals, 0, sizeof(Totals));
    r->gap_n = 0;
    r->gap_next = -1;
    ring_unlock(r);
    Py_RETURN_NONE;
}

/* Drop every queued cycle (after fork, at shutdown); returns how many. */
static PyObject *
Ring_clear_queue(Ring *r, PyObject *Py_UNUSED(ignored))
{
    Py_ssize_t n = 0;
    Deferral d;
    defer_begin(&d);
    ring_lock(r);
    while (r->tail != r->head) {
        Slot *s = &r->slots[r->tail % (uint64_t)r->nslots];
        /* Every cycle begun and not resolved, the one still open too (its thread died, or
         * shutdown came first): each is lost here, and counted by the caller. */
        if (STATE(s) == SLOT_DONE || STATE(s) == SLOT_DEFERRED || STATE(s) == SLOT_OPEN)
            n++;
        STATE_SET(s, SLOT_VOID); /* an open cycle's end() finds its slot gone */
        slot_drop_held(r, s);
        slot_clear_objs(r, s);
        STORE64(&r->tail, r->tail + 1);
    }
    for (Py_ssize_t i = 0; r->pk_buf != NULL && i < 3 * PARK_CAP; i++)
        if (parked_at(r, i))
            drop_ref(&r->pk_buf[i]); /* what the pump parked: lost to its pool */
    r->pk_ncopies = r->pk_ndrafts = r->pk_nevents = 0;
    r->pump_cycles = r->pump_total = 0; /* the resolver starts its count anew */
    __atomic_store_n(&r->waiting, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&r->nheld, 0, __ATOMIC_RELAXED);
    r->deferred = 0;
    r->if_idx = -1;
    r->if_polls = 0;
    ring_unlock(r);
    defer_end(&d);
    return PyLong_FromSsize_t(n);
}

/* Hand on, unsettled, the deferred cycles that ended ``timeout_ns`` or longer ago, or with
 * ``settle_backlog`` done cycles waiting behind them (see PyRing.expire); returns how many. */
static PyObject *
Ring_expire(Ring *r, PyObject *arg)
{
    long long timeout = PyLong_AsLongLong(arg);
    if (timeout == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = 0;
    if (r->deferred <= 0)
        return PyLong_FromSsize_t(0);
    int64_t now = ring_now(r);
    Deferral d;
    defer_begin(&d);
    ring_lock(r);
    Py_ssize_t behind = LOADN(&r->waiting); /* done cycles after the slot walked */
    for (uint64_t p = r->tail; p != r->head; p++) {
        Slot *s = &r->slots[p % (uint64_t)r->nslots];
        int st = STATE(s);
        if (st == SLOT_OPEN)
            break;
        if (st == SLOT_DONE)
            behind--;
        if (st != SLOT_DEFERRED)
            continue;
        if (now - s->ts[r->nph] < (int64_t)timeout && behind < r->settle_backlog)
            break;
        r->deferred--;
        r->unsettled++;
        clear_acceptance(r, s);
        STATE_SET(s, SLOT_DONE);
        r->enqueued++;
        ADDN(&r->waiting, 1);
        if (s->ev != NULL || s->copy != NULL)
            ADDN(&r->nheld, 1);
        n++;
    }
    ring_unlock(r);
    defer_end(&d);
    return PyLong_FromSsize_t(n);
}

static PyObject *
Ring_take_dropped(Ring *r, PyObject *Py_UNUSED(ignored))
{
    PyObject *out = r->dropped;
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL)
        return NULL;
    r->dropped = fresh;
    return out;
}

static int
read_bounds_into(PyObject *obj, double *out, int *n)
{
    PyObject *seq = PySequence_Fast(obj, "bounds must be a sequence of floats");
    if (seq == NULL)
        return -1;
    Py_ssize_t len = PySequence_Fast_GET_SIZE(seq);
    if (len > MAX_BOUNDS) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "too many bucket bounds");
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        double x = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (x == -1.0 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        if (i > 0 && !(x > out[i - 1])) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "bounds must be strictly increasing");
            return -1;
        }
        out[i] = x;
    }
    *n = (int)len;
    Py_DECREF(seq);
    return 0;
}

static PyObject *
Ring_len(Ring *r, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSsize_t(LOADN(&r->waiting));
}

static Py_ssize_t
Ring_sq_len(Ring *r)
{
    return LOADN(&r->waiting);
}

/* -- Ring: construction -------------------------------------------------------------------- */

static int
Ring_init(Ring *r, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"slow", "phases", "capacity", "max_draft_length", "wake_at",
                         "duration_bounds", "batch_bounds", "null_cycle", NULL};
    PyObject *slow, *phases, *db, *bb, *null_cycle;
    Py_ssize_t capacity, wake_at;
    int k_max;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!ninOOO", kw, &slow, &PyTuple_Type, &phases,
                                     &capacity, &k_max, &wake_at, &db, &bb, &null_cycle))
        return -1;
    Py_ssize_t nph = PyTuple_GET_SIZE(phases);
    if (nph < 1 || nph > MAX_PHASES) {
        PyErr_Format(PyExc_ValueError, "between 1 and %d phases, got %zd", MAX_PHASES, nph);
        return -1;
    }
    if (capacity < 1 || k_max < 0 || k_max > 255) {
        PyErr_SetString(PyExc_ValueError, "capacity >= 1 and 0 <= max_draft_length <= 255");
        return -1;
    }
    if (r->slots != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Ring is initialised once");
        return -1;
    }
    if (read_bounds_into(db, r->dbounds, &r->ndb) < 0 || read_bounds_into(bb, r->bbounds, &r->nbb) < 0)
        return -1;
    r->slots = PyMem_Calloc((size_t)capacity + 1 - SPECOBS_CORE_FAULT_OVERRUN, sizeof(Slot));
    r->totals = PyMem_Calloc(1, sizeof(Totals));
    if (r->slots == NULL || r->totals == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    r->capacity = capacity;
    r->if_idx = -1;
    r->gap_next = -1;
    r->idle_gap_ns = 1000000000; /* specobs._ring.IDLE_GAP_NS */
    r->nslots = capacity + 1;
    r->nph = (int)nph;
    r->k_max = k_max;
    r->wake_at = wake_at;
    r->settle_backlog = wake_at < capacity / 2 ? wake_at : capacity / 2;
    if (r->settle_backlog < 1)
        r->settle_backlog = 1;
    r->max_seq = MAX_CYCLE_SEQUENCES;
    r->max_queue_bytes = MAX_QUEUE_BYTES;
    r->enabled = 1;
    r->interval = 1;
    r->clock_try_at = -1;
    r->park_events = PARK_CAP;
    r->park_copies = PARK_CAP;
    r->dropped = PyList_New(0);
    if (r->dropped == NULL)
        return -1;
    Py_INCREF(slow);
    r->slow = slow;
    Py_INCREF(phases);
    r->phases = phases;
    Py_INCREF(null_cycle);
    r->null_cycle = null_cycle;
    Py_INCREF(Py_None);
    r->record_fn = Py_None;
    Py_INCREF(Py_None);
    r->stream = Py_None;
    Py_INCREF(Py_None);
    r->copy_type = Py_None;
    return 0;
}

/* The Ring's own references, in the order tp_traverse visits them and tp_clear lets go of them:
 * one list, so that no field is visited and never cleared, or cleared and never visited.
 * REF(field) is one reference, REFS(field, n) an array of n. */
#define RING_REFS(REF, REFS)                                                                  \
    REF(slow) REF(phases) REF(record_fn) REF(stream) REF(current) REFS(spares, NSPARES)       \
    REF(null_cycle) REF(dropped) REF(copy_type) REF(nc_pools) REF(nc_stream_fn)
#define RING_VISIT(field) Py_VISIT(r->field);
#define RING_VISIT_ALL(field, n)                                                              \
    for (Py_ssize_t i = 0; i < (n); i++)                                                      \
        Py_VISIT(r->field[i]);
#define RING_CLEAR(field) Py_CLEAR(r->field);
#define RING_CLEAR_ALL(field, n)                                                              \
    for (Py_ssize_t i = 0; i < (n); i++)                                                      \
        Py_CLEAR(r->field[i]);

static int
Ring_traverse(Ring *r, visitproc visit, void *arg)
{
    RING_REFS(RING_VISIT, RING_VISIT_ALL)
    for (Py_ssize_t i = 0; r->hc_key != NULL && i < HANDLE_CACHE; i++)
        Py_VISIT(r->hc_key[i]);
    for (Py_ssize_t i = 0; r->pk_buf != NULL && i < 3 * PARK_CAP; i++)
        if (parked_at(r, i))
            Py_VISIT(r->pk_buf[i]);
    if (r->slots != NULL) {
        for (Py_ssize_t i = 0; i < r->nslots; i++) {
            Slot *s = &r->slots[i];
            Py_VISIT(s->ev);
            Py_VISIT(s->copy);
            Py_VISIT(s->acc);
            Py_VISIT(s->draft);
            Py_VISIT(s->emitted);
            Py_VISIT(s->batch_obj);
            Py_VISIT(s->dk_obj);
        }
    }
    return 0;
}

static int
Ring_clear(Ring *r)
{
    RING_REFS(RING_CLEAR, RING_CLEAR_ALL)
    r->nc_memcpy = NULL;
    r->ne_elapsed = NULL;
    handles_forget(r);
    for (Py_ssize_t i = 0; r->pk_buf != NULL && i < 3 * PARK_CAP; i++)
        if (parked_at(r, i))
            Py_CLEAR(r->pk_buf[i]);
    r->pk_ncopies = r->pk_ndrafts = r->pk_nevents = 0;
    if (r->slots != NULL) {
        for (Py_ssize_t i = 0; i < r->nslots; i++) {
            Slot *s = &r->slots[i];
            Py_CLEAR(s->ev);
            Py_CLEAR(s->copy);
            slot_clear_objs(r, s);
        }
    }
    return 0;
}

static void
Ring_dealloc(Ring *r)
{
    PyObject_GC_UnTrack(r);
    Ring_clear(r);
    if (r->slots != NULL) {
        for (Py_ssize_t i = 0; i < r->nslots; i++)
            PyMem_RawFree(r->slots[i].lens);
        PyMem_Free(r->slots);
        r->slots = NULL;
    }
    PyMem_Free(r->totals);
    r->totals = NULL;
    if (r->mu_gen != 0)
        pthread_mutex_destroy(&r->mu);
    if (r->pm_gen != 0) {
        pthread_mutex_destroy(&r->pm);
        pthread_mutex_destroy(&r->wk);
        pthread_cond_destroy(&r->pc);
    }
    PyMem_RawFree(r->pk_buf);
    r->pk_buf = NULL;
    PyMem_RawFree(r->pk_cpool);
    r->pk_cpool = NULL;
    Py_TYPE(r)->tp_free((PyObject *)r);
}

static PyObject *
Ring_get_current(Ring *r, void *Py_UNUSED(closure))
{
    PyObject *c = r->current ? r->current : Py_None;
    Py_INCREF(c);
    return c;
}

static int
set_obj(PyObject **slot, PyObject *v)
{
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete this attribute");
        return -1;
    }
    Py_INCREF(v);
    Py_XSETREF(*slot, v);
    return 0;
}

/* The Ring's object attributes that are never NULL: the getset closure is the field's offset. */
#define RING_OBJ(r, closure) ((PyObject **)((char *)(r) + (uintptr_t)(closure)))
#define RING_OBJ_OFFSET(field) ((void *)(uintptr_t)offsetof(Ring, field))

static PyObject *
Ring_get_obj(Ring *r, void *closure)
{
    PyObject *v = *RING_OBJ(r, closure);
    Py_INCREF(v);
    return v;
}

static int
Ring_set_obj(Ring *r, PyObject *v, void *closure)
{
    return set_obj(RING_OBJ(r, closure), v);
}

static int
Ring_set_copy_type(Ring *r, PyObject *v, void *closure)
{
    if (v != NULL && v != Py_None && !PyType_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "copy_type must be a type or None");
        return -1;
    }
    return Ring_set_obj(r, v, closure);
}

static PyObject *
Ring_forget_current(Ring *r, PyObject *Py_UNUSED(ignored))
{
    /* After fork: the parent's open cycle is not the child's (its handle stays closed). */
    if (r->current != NULL) {
        Cycle *c = (Cycle *)r->current;
        c->closed = 1;
        Slot *s = slot_of(c);
        if (owns(c, s))
            STATE_SET(s, SLOT_VOID);
        Py_CLEAR(r->current);
    }
    Py_RETURN_NONE;
}

static PyGetSetDef Ring_getset[] = {
    {"current", (getter)Ring_get_current, NULL, "the open cycle, or None", NULL},
    {"record_fn", (getter)Ring_get_obj, (setter)Ring_set_obj, NULL, RING_OBJ_OFFSET(record_fn)},
    {"stream", (getter)Ring_get_obj, (setter)Ring_set_obj, NULL, RING_OBJ_OFFSET(stream)},
    {"copy_type", (getter)Ring_get_obj, (setter)Ring_set_copy_type, NULL,
     RING_OBJ_OFFSET(copy_type)},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef Ring_members[] = {
    {"enabled", T_INT, offsetof(Ring, enabled), 0, NULL},
    {"sampling", T_INT, offsetof(Ring, sampling), 0, NULL},
    {"interval", T_LONGLONG, offsetof(Ring, interval), 0, NULL},
    {"clock_try_at", T_LONGLONG, offsetof(Ring, clock_try_at), 0, NULL},
    {"wake_at", T_PYSSIZET, offsetof(Ring, wake_at), 0, NULL},
    {"max_cycle_sequences", T_PYSSIZET, offsetof(Ring, max_seq), 0,
     "most values one list of a cycle's acceptance may carry (more: refused, oversized)"},
    {"max_queue_bytes", T_LONGLONG, offsetof(Ring, max_queue_bytes), 0,
     "most bytes the objects waiting cycles keep may hold (past it: refused, oversized)"},
    {"queued_bytes", T_LONGLONG, offsetof(Ring, queued_bytes), READONLY,
     "the estimated bytes the objects waiting cycles keep hold"},
    {"settle_backlog", T_PYSSIZET, offsetof(Ring, settle_backlog), 0,
     "done cycles waiting behind a deferred one that hand it on unsettled before its timeout"},
    {"tick", T_LONGLONG, offsetof(Ring, tick), 0, NULL},
    {"capacity", T_PYSSIZET, offsetof(Ring, capacity), READONLY, NULL},
    {"begun", T_LONGLONG, offsetof(Ring, begun), READONLY, NULL},
    {"enqueued", T_LONGLONG, offsetof(Ring, enqueued), READONLY, NULL},
    {"dropped_queue_full", T_LONGLONG, offsetof(Ring, dropped_queue_full), READONLY, NULL},
    {"discarded", T_LONGLONG, offsetof(Ring, discarded), READONLY, NULL},
    {"excepted", T_LONGLONG, offsetof(Ring, excepted), READONLY, NULL},
    {"deferred", T_LONGLONG, offsetof(Ring, deferred), READONLY,
     "cycles ended by defer() awaiting settle()"},
    {"unsettled", T_LONGLONG, offsetof(Ring, unsettled), READONLY,
     "deferred cycles the timeout handed on without acceptance"},
    {"copy_ns", T_LONGLONG, offsetof(Ring, copy_ns), READONLY, NULL},
    {"drained", T_LONGLONG, offsetof(Ring, drained), READONLY, NULL},
    {"native_copies", T_LONGLONG, offsetof(Ring, nc_copies), READONLY,
     "CUDA acceptance copies started in C"},
    {"native_fences", T_LONGLONG, offsetof(Ring, nc_fences), READONLY,
     "of those, the copies that recorded their slot's event"},
    {"fence_every", T_PYSSIZET, offsetof(Ring, nc_fence_every), 0,
     "one native copy in this many records its slot's event (1 or less: every one)"},
    {"in_flight_index", T_LONGLONG, offsetof(Ring, if_idx), 0,
     "the cycle whose copy the poll found first in flight by its sentinel (-1: none)"},
    {"in_flight_polls", T_LONGLONG, offsetof(Ring, if_polls), 0,
     "for how many polls running it was first"},
    {"held_cycles", T_PYSSIZET, offsetof(Ring, nheld), READONLY,
     "waiting cycles that hold events or a copy (0: the poll has nothing to ask)"},
    {"walk_cpu_out", T_LONGLONG, offsetof(Ring, walk_cpu_out), READONLY,
     "the last drain_into: thread CPU ns when it first let go of the GIL"},
    {"walk_cpu_in", T_LONGLONG, offsetof(Ring, walk_cpu_in), READONLY,
     "the last drain_into: thread CPU ns when it last took the GIL back"},
    {"walk_hold_ns", T_LONGLONG, offsetof(Ring, walk_hold_ns), READONLY,
     "the last drain_into: its longest GIL hold between two walks, in thread CPU ns"},
    {"walk_count", T_LONGLONG, offsetof(Ring, walk_count), READONLY,
     "the last drain_into: how many times it let go of the GIL to walk"},
    {"nogil_cycles", T_LONGLONG, offsetof(Ring, nogil_cycles), READONLY,
     "cycles drained with the GIL let go (the common case of drain_into)"},
    {"nogil_walks", T_LONGLONG, offsetof(Ring, nogil_walks), READONLY,
     "drains that let go of the GIL to walk the ring"},
    {"nogil_ns", T_LONGLONG, offsetof(Ring, nogil_ns), READONLY,
     "thread CPU those walks took, in ns: none of it with the GIL held"},
    {"native_gpu_cycles", T_LONGLONG, offsetof(Ring, ne_cycles), READONLY,
     "sampled cycles whose GPU times drain_into read itself (set_native_events)"},
    {"native_gpu_cost", T_LONGLONG, offsetof(Ring, ne_cost), READONLY,
     "the worker's ns recording those cycles' events"},
    {"pump_calls", T_LONGLONG, offsetof(Ring, pump_calls), READONLY,
     "calls of pump(): each a return to Python"},
    {"pump_passes", T_LONGLONG, offsetof(Ring, pump_passes), READONLY,
     "passes the pump made over the ring with the GIL let go"},
    {"pump_walked", T_LONGLONG, offsetof(Ring, pump_walked), READONLY,
     "cycles the pump walked"},
    {"pump_ns", T_LONGLONG, offsetof(Ring, pump_ns), READONLY,
     "thread CPU inside pump(), in ns: none of it with the GIL held"},
    {"pump_cpu_in", T_LONGLONG, offsetof(Ring, pump_cpu_in), READONLY,
     "thread CPU ns when the last pump() took the GIL back"},
    {"pumping", T_INT, offsetof(Ring, pumping), READONLY, "a thread is inside pump()"},
    {"park_copies", T_PYSSIZET, offsetof(Ring, park_copies), READONLY,
     "native copies the pump parks before it comes back to hand them to their pool (the "
     "worker takes parked ones back itself): the smallest pool (at most 512)"},
    {"park_events", T_PYSSIZET, offsetof(Ring, park_events), 0,
     "sampled cycles' event lists the pump parks before it comes back to hand them to the "
     "clock (at most 512): a quarter of the clock's pool"},
    {"writer", T_ULONG, offsetof(Ring, writer), READONLY,
     "native id of the thread that began the last cycle (0: none yet, or not known)"},
    {"idle_gap_ns", T_LONGLONG, offsetof(Ring, idle_gap_ns), 0,
     "gaps between a thread's cycles longer than this (ns) are counted as idle, not observed"},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *
Ring_set_native_copy(Ring *r, PyObject *args)
{
    unsigned long long memcpy_addr = 0, record_addr = 0, lasterr_addr = 0;
    PyObject *stream_fn = Py_None, *pools = Py_None;
    long device = 0;
    Py_ssize_t capacity = 0, low = 0, fence_every = 1;
    if (!PyArg_ParseTuple(args, "|KKKOlOnnn:set_native_copy", &memcpy_addr, &record_addr,
                          &lasterr_addr, &stream_fn, &device, &pools, &capacity, &low,
                          &fence_every))
        return NULL;
    if (r->pk_buf != NULL && r->pk_ncopies > 0) {
        /* Parked copies name their pools: back to those before the pools may change. */
        PyObject *lost = PyList_New(0);
        if (lost == NULL)
            return NULL;
        walker_take(r);
        Parked pk = {r->pk_buf, NULL, NULL, r->pk_ncopies, 0, 0, 0, NULL};
        r->pk_ncopies = 0;
        int rc = unpark(&pk, lost);
        walker_give(r);
        Py_DECREF(lost);
        if (rc < 0)
            PyErr_Clear();
    }
    if (memcpy_addr == 0) { /* off: every copy through copy_to_host */
        r->nc_memcpy = NULL;
        r->nc_record = NULL;
        r->nc_lasterr = NULL;
        Py_CLEAR(r->nc_pools);
        Py_CLEAR(r->nc_stream_fn);
        Py_RETURN_NONE;
    }
    if (record_addr == 0 || lasterr_addr == 0 || !PyCallable_Check(stream_fn)
        || !PyDict_Check(pools) || capacity < 0 || fence_every < 1) {
        PyErr_SetString(PyExc_TypeError, "set_native_copy(memcpy, record, get_last_error, "
                                         "stream_fn, device, pools, capacity, low[, "
                                         "fence_every]): expected three function addresses, "
                                         "a callable, an int, a dict of lists, two counts and "
                                         "a fence period >= 1");
        return NULL;
    }
    r->nc_memcpy = (int (*)(void *, const void *, size_t, int, void *))(uintptr_t)memcpy_addr;
    r->nc_record = (int (*)(void *, void *))(uintptr_t)record_addr;
    r->nc_lasterr = (int (*)(void))(uintptr_t)lasterr_addr;
    Py_INCREF(stream_fn);
    Py_XSETREF(r->nc_stream_fn, stream_fn);
    Py_INCREF(pools);
    Py_XSETREF(r->nc_pools, pools);
    r->nc_device = device;
    /* The worker takes the copies the pump parked back itself (parked_copy): a whole pool may
     * be parked; with the pool's free ones they are what the low-water mark counts. */
    Py_ssize_t pos = 0, smallest = PARK_CAP * 4;
    PyObject *key, *value;
    while (PyDict_Next(pools, &pos, &key, &value))
        if (PyList_Check(value) && PyList_GET_SIZE(value) < smallest)
            smallest = PyList_GET_SIZE(value);
    r->park_copies = smallest > 1 ? smallest : 1;
    r->nc_capacity = capacity;
    r->nc_low = low;
    r->nc_fence_every = fence_every;
    r->nc_since_fence = 0;
    r->nc_last_stream = (void *)UINTPTR_MAX; /* no copy yet: the first one fences (the
                                               * legacy default stream is NULL itself) */
    Py_RETURN_NONE;
}

static void
handles_forget(Ring *r)
{
    if (r->hc_key != NULL) {
        PyObject **keys = r->hc_key;
        r->hc_key = NULL; /* before any reference is let go of (that may run Python) */
        for (Py_ssize_t i = 0; i < HANDLE_CACHE; i++)
            Py_XDECREF(keys[i]);
        PyMem_Free(keys);
    }
    PyMem_Free(r->hc_val);
    r->hc_val = NULL;
    r->hc_n = 0;
}

static PyObject *
Ring_set_native_events(Ring *r, PyObject *args)
{
    unsigned long long elapsed_addr = 0, lasterr_addr = 0, query_addr = 0;
    if (!PyArg_ParseTuple(args, "|KKK:set_native_events", &elapsed_addr, &lasterr_addr,
                          &query_addr))
        return NULL;
    walker_take(r); /* the pump reads these and the handle cache */
    r->ne_elapsed = (int (*)(float *, void *, void *))(uintptr_t)elapsed_addr;
    r->ne_lasterr = (int (*)(void))(uintptr_t)lasterr_addr;
    r->ne_query = elapsed_addr ? (int (*)(void *))(uintptr_t)query_addr : NULL;
    handles_forget(r); /* another clock's events, or none */
    r->ne_thread = PyThread_get_thread_ident();
    walker_give(r);
    Py_RETURN_NONE;
}

static PyMethodDef Ring_methods[] = {
    {"counters", (PyCFunction)Ring_counters, METH_NOARGS,
     "counters(): (discarded, dropped_queue_full, unsettled, native_gpu_cycles, "
     "native_gpu_cost, excepted), read together."},
    {"set_native_events", (PyCFunction)Ring_set_native_events, METH_VARARGS,
     "set_native_events(elapsed, get_last_error[, query]): read sampled cycles' GPU times in "
     "drain_into, and ask their events in poll, through these runtime functions "
     "(cudaEventElapsedTime, cudaGetLastError, cudaEventQuery), on the calling thread only "
     "(0: turn it off)."},
    {"set_native_copy", (PyCFunction)Ring_set_native_copy, METH_VARARGS,
     "Start CUDA acceptance copies in C through these runtime functions (0: turn it off)."},
    {"begin", (PyCFunction)(void (*)(void))Ring_begin, METH_FASTCALL | METH_KEYWORDS,
     "begin(batch_size=None, draft_length=None)\n--\n\nStart a cycle (and its first phase); "
     "returns its handle. draft_length: the k the engine scheduled for this cycle's draft "
     "phase (0: a step that drafts nothing)."},
    {"pending", (PyCFunction)Ring_pending, METH_O, NULL},
    {"poll", (PyCFunction)(void (*)(void))Ring_poll, METH_FASTCALL,
     "poll(limit, query, polls_before_query): the bound below which the first limit waiting "
     "cycles completed on the GPU, on one stream."},
    {"drain", (PyCFunction)(void (*)(void))Ring_drain, METH_FASTCALL, NULL},
    {"drain_into", (PyCFunction)(void (*)(void))Ring_drain_into, METH_FASTCALL, NULL},
    {"totals", (PyCFunction)Ring_totals, METH_NOARGS, NULL},
    {"reset_totals", (PyCFunction)Ring_reset_totals, METH_NOARGS, NULL},
    {"clear_queue", (PyCFunction)Ring_clear_queue, METH_NOARGS, NULL},
    {"take_dropped", (PyCFunction)Ring_take_dropped, METH_NOARGS, NULL},
    {"expire", (PyCFunction)Ring_expire, METH_O,
     "expire(timeout_ns): hand on, unsettled, the deferred cycles ended that long ago."},
    {"forget_current", (PyCFunction)Ring_forget_current, METH_NOARGS, NULL},
    {"pump", (PyCFunction)(void (*)(void))Ring_pump, METH_FASTCALL,
     "pump(poll_ns, next_trace, slow_ns, settle_ns, return_after_ns): wait, poll and walk with "
     "the GIL let go until Python is needed; returns why."},
    {"cache_handles", (PyCFunction)Ring_cache_handles, METH_O,
     "cache_handles(events): read these events' handles into the ring's cache now."},
    {"pump_wake", (PyCFunction)Ring_pump_wake, METH_NOARGS,
     "Have pump() come back to Python (now, or at once the next time it is called)."},
    {"queued", (PyCFunction)Ring_len, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods Ring_as_sequence = {
    .sq_length = (lenfunc)Ring_sq_len,
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "specobs._core.Ring",
    .tp_basicsize = sizeof(Ring),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The native hot path's ring of cycle slots (see specobs/_ring.py).",
    .tp_traverse = (traverseproc)Ring_traverse,
    .tp_clear = (inquiry)Ring_clear,
    .tp_dealloc = (destructor)Ring_dealloc,
    .tp_init = (initproc)Ring_init,
    .tp_new = PyType_GenericNew,
    .tp_methods = Ring_methods,
    .tp_members = Ring_members,
    .tp_getset = Ring_getset,
    .tp_as_sequence = &Ring_as_sequence,
};

static PyObject *
core_perf_counter_ns(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLongLong(now_ns());
}

/* -- tests: a fake runtime's event functions -------------------------------------------------
 * What ``specobs.timing.fake.FakeNativeEventClock`` hands ``set_native_events``: C functions,
 * so that the walk without the GIL calls no Python (a ``ctypes`` callback would take the GIL
 * under the ring's lock). A fake event's handle is the address of three int64 fields in memory
 * its test owns: the timeline position it was recorded at, whether it was, and the address of
 * the fake GPU's completion frontier. */
typedef struct {
    int64_t ts, recorded;
    const int64_t *completed;
} FakeEventMem;

static int
fake_event_elapsed(float *ms, void *start, void *end)
{
    const FakeEventMem *a = start, *b = end;
    if (a == NULL || b == NULL || ms == NULL)
        return 400; /* cudaErrorInvalidResourceHandle */
    if (!a->recorded || !b->recorded || a->ts > *a->completed || b->ts > *b->completed)
        return 600; /* cudaErrorNotReady */
    *ms = (float)((double)(b->ts - a->ts) / 1e6);
    return 0;
}

static int
fake_event_query(void *event)
{
    const FakeEventMem *e = event;
    if (e == NULL)
        return 400;
    return e->recorded && e->ts <= *e->completed ? 0 : 600;
}

static int
fake_last_error(void)
{
    return 0;
}

static PyObject *
core_fake_event_fns(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(KKK)", (unsigned long long)(uintptr_t)fake_event_elapsed,
                         (unsigned long long)(uintptr_t)fake_last_error,
                         (unsigned long long)(uintptr_t)fake_event_query);
}

static PyMethodDef core_methods[] = {
    {"_fake_event_fns", core_fake_event_fns, METH_NOARGS,
     "Tests: (elapsed, get_last_error, query) of a fake runtime whose event handles point at "
     "(ts, recorded, &completed) int64 fields."},
    {"set_detail_type", core_set_detail_type, METH_O,
     "set_detail_type(cls): the named tuple class drains hand their details over as "
     "(specobs._ring.Detail)."},
    {"now_ns", core_perf_counter_ns, METH_NOARGS,
     "The clock the ring stamps with (CLOCK_MONOTONIC, time.perf_counter_ns on Linux)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "specobs._core",
    "The native hot path: a ring of cycle slots written by C methods (see specobs/_ring.py).",
    -1, core_methods, NULL, NULL, NULL, NULL,
};

#define INTERN(var, text)                                                                    \
    do {                                                                                     \
        var = PyUnicode_InternFromString(text);                                              \
        if (var == NULL)                                                                     \
            return NULL;                                                                     \
    } while (0)

static void
bump_fork_gen(void)
{
    __atomic_add_fetch(&g_fork_gen, 1, __ATOMIC_RELAXED);
}

PyMODINIT_FUNC
PyInit__core(void)
{
    static int atfork_done = 0;
    if (!atfork_done) {
        if (pthread_atfork(NULL, NULL, bump_fork_gen) != 0)
            return PyErr_Format(PyExc_OSError, "pthread_atfork failed");
        atfork_done = 1;
    }
    INTERN(s_misuse, "misuse");
    INTERN(s_misuse_mark, "misuse_mark");
    INTERN(s_misuse_end, "misuse_end");
    INTERN(s_internal_error, "internal_error");
    INTERN(s_queue_full, "queue_full");
    INTERN(s_wake, "wake");
    INTERN(s_sample, "sample");
    INTERN(s_try_clock, "try_clock");
    INTERN(s_copy_to_host, "copy_to_host");
    INTERN(s_tolist, "tolist");
    INTERN(s_is_cuda, "is_cuda");
    INTERN(s_numel, "numel");
    INTERN(s_accepted, "accepted");
    INTERN(s_draft_length, "draft_length");
    INTERN(s_batch_size, "batch_size");
    INTERN(s_emitted, "emitted");
    INTERN(s_event, "event");
    INTERN(s_ptr, "ptr");
    INTERN(s_itemsize, "itemsize");
    INTERN(s_length, "length");
    INTERN(s_fenced, "fenced");
    INTERN(s_sentinel, "sentinel");
    INTERN(s_free, "_free");
    INTERN(s_dtype, "dtype");
    INTERN(s_is_contiguous, "is_contiguous");
    INTERN(s_get_device, "get_device");
    INTERN(s_data_ptr, "data_ptr");
    INTERN(s_handle, "handle");
    INTERN(s_cuda_event, "cuda_event");
    INTERN(s_copy_event_failed, "copy_event_failed");
    INTERN(s_landed, "landed");
    INTERN(s_oversized, "oversized");
    INTERN(s_pump_woken, "woken");
    INTERN(s_pump_python, "python");
    INTERN(s_pump_expire, "expire");
    INTERN(s_pump_parked, "parked");
    INTERN(s_pump_counts, "counts");
    INTERN(s_pump_writer, "writer");
    INTERN(s_pump_tick, "tick");
    INTERN(m_begin_open, "begin() while the previous cycle was open; the open cycle was "
                         "discarded (an observer belongs to one engine thread: configure one "
                         "per thread)");
    INTERN(m_end_twice, "end() on a cycle that already ended");
    INTERN(m_defer_twice, "defer() on a cycle that already ended");
    INTERN(m_settle_twice, "settle() twice on one cycle");
    INTERN(m_settle_undeferred, "settle() on a cycle that was not deferred");
    INTERN(m_settle_late, "settle() after the cycle's timeout (counted unsettled) or after it "
                          "was dropped");
    INTERN(m_accept_closed, "accept() after the cycle ended");
    if (PyType_Ready(&RingType) < 0 || PyType_Ready(&CycleType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&core_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RingType);
    if (PyModule_AddObject(m, "Ring", (PyObject *)&RingType) < 0) {
        Py_DECREF(&RingType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&CycleType);
    if (PyModule_AddObject(m, "Cycle", (PyObject *)&CycleType) < 0) {
        Py_DECREF(&CycleType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
