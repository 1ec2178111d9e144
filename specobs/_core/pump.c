/* The walk without the GIL and the pump. The walk takes the common case of a drain (cycles of
 * numbers, native copies landed, sampled cycles whose handles are cached) with the GIL let go;
 * the pump is the resolver's thread waiting, polling and walking inside one C call, back in
 * Python only for what needs it (specobs/_ring.py has no twin of either: see
 * docs/architecture.md, "C-only").
 *
 * Locks, always in this order: the GIL (let go before any of the others is waited for), the
 * walker's lock ``wk`` (held by the pump for its whole call, and by every other walker of the
 * tail), the ring's lock ``mu`` (held for each walk), the pump's ``pm`` (its flag, briefly).
 * Without the GIL nothing here touches a reference count or calls the Python API: what a walk
 * lets go of is parked, and handed back by whoever holds the GIL next.
 */
#include "core.h"

/* -- the pump's locks ----------------------------------------------------------------------- */

/* Make the pump's locks and condition (see pump_made in core.h). ``wk`` is recursive: Python
 * code a walker runs (a clock's query) may call another walker on the same thread. */
void
specobs_pump_init(Ring *r, uint64_t gen)
{
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

/* Wake the pump (PUMP_PASS: walk now; PUMP_RETURN: come back to Python). A flag set while no
 * thread pumps is kept for the next pump() call. */
void
specobs_pump_signal(Ring *r, int flag)
{
    pump_made(r);
    pthread_mutex_lock(&r->pm);
    r->pump_flag |= flag;
    pthread_cond_signal(&r->pc);
    pthread_mutex_unlock(&r->pm);
}

/* With the GIL, before a walker of the tail (a drain, the poll) reads the ring: the pump is
 * asked to come back, and its lock is waited for with the GIL let go. */
void
specobs_walker_take(Ring *r)
{
    pump_made(r);
    if (pthread_mutex_trylock(&r->wk) == 0)
        return;
    __atomic_add_fetch(&r->wk_wanted, 1, __ATOMIC_SEQ_CST);
    specobs_pump_signal(r, PUMP_YIELD);
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&r->wk);
    Py_END_ALLOW_THREADS
    __atomic_sub_fetch(&r->wk_wanted, 1, __ATOMIC_SEQ_CST);
}

/* -- the walk without the GIL ----------------------------------------------------------- */

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
        if (g != NULL && (specobs_read_gpu(r, s, g, gsum) < 0 || (slow_ns >= 0 && *gsum >= slow_ns)))
            return 0;
    }
    else if (slow_ns >= 0 && s->ts[r->nph] - s->ts[0] >= slow_ns)
        return 0; /* traced as slow */
    for (int32_t i = 0; s->copy != NULL && i < s->clen; i++) {
        int64_t v = element_at(s->cptr, s->cisz, i);
        if (v < 0 || v > s->ck)
            return 0; /* out of range: the resolver's validation says which */
    }
    return 1;
}

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
            if (slot_holds_refs(s))
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
            if (lens_room(s, m) < 0) {
                pk->nheld -= 1;
                break; /* the drain with the GIL reads it, and reports the memory */
            }
            int64_t sum = 0;
            for (int32_t i = 0; i < m; i++) {
                int64_t v = element_at(s->cptr, s->cisz, i);
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
int
specobs_unpark(Parked *pk, PyObject *released)
{
    int rc = 0;
    for (Py_ssize_t i = 0; i < pk->ncopies; i++) {
        PyObject *copy = pk->copies[i];
        if (specobs_copy_back(copy, released) < 0)
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

/* The walk above for drain_into, when enough cycles wait and the first one is for it: the GIL
 * let go for the walk, the parked references handed back after. Returns the cycles taken, or -1
 * on an error (the walk itself cannot fail; allocating its parking can). */
Py_ssize_t
specobs_drain_nogil(Ring *r, long long bound, Py_ssize_t limit, PyObject *trace, long long slow_ns,
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
        if (slot_holds_refs(s))
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
    int rc = specobs_unpark(&pk, released);
    PyMem_Free(park);
    *total_out = total;
    return rc < 0 ? -1 : n;
}

/* -- the pump ------------------------------------------------------------------------------ */

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
            return late || LOADN(&r->waiting) >= r->settle_backlog ? STR(pump_expire) : NULL;
        }
        if (st == SLOT_VOID) {
            if (slot_holds_refs(s))
                return STR(pump_python); /* references let go of with the GIL */
            STORE64(&r->tail, r->tail + 1);
            continue;
        }
        if (s->ev != NULL) { /* its last event completed: so did everything before it */
            if (!nev)
                return STR(pump_python);
            if (s->evn == 0)
                specobs_handles_cached(r, s);
            if (s->evn != nph + 1)
                return STR(pump_python);
            int q = r->ne_query((void *)(uintptr_t)s->evh[nph]);
            if (q != 0) {
                if (r->ne_lasterr != NULL)
                    r->ne_lasterr(); /* not left for the engine to find */
                return q == 600 ? NULL : STR(pump_python); /* cudaErrorNotReady: not yet */
            }
            if (r->pk_nevents >= (r->park_events < PARK_CAP ? r->park_events : PARK_CAP))
                return STR(pump_parked);
        }
        else if (s->copy != NULL) {
            if (s->cptr == NULL || (s->cisz != 4 && s->cisz != 8))
                return STR(pump_python);
            if (!bytes_landed(s->cptr, (size_t)s->cisz, (size_t)s->clen)) {
                r->if_polls = r->if_idx == s->idx ? r->if_polls + 1 : 1;
                r->if_idx = s->idx;
                return r->if_polls >= PUMP_POLLS_BEFORE_PYTHON ? STR(pump_python) : NULL;
            }
        }
        if (s->copy != NULL
            && (r->pk_ncopies >= (r->park_copies < PARK_CAP ? r->park_copies : PARK_CAP)
                || r->pk_ndrafts >= PARK_CAP))
            return STR(pump_parked);
        Parked pk = parking_of(r, r->pk_cpool);
        int64_t total = 0;
        Py_ssize_t n = walk_nogil(r, r->totals, s->idx + 1, 1, next_trace, slow_ns, nev, &pk,
                                  &total);
        r->pk_ncopies = pk.ncopies;
        r->pk_ndrafts = pk.ndrafts;
        r->pk_nevents = pk.nevents;
        if (n == 0)
            return STR(pump_python);
        ADDN(&r->waiting, -n);
        ADDN(&r->nheld, -pk.nheld);
        r->pump_cycles += n;
        r->pump_total += total;
        r->pump_walked += n;
        r->nogil_cycles += n;
    }
}

/* The parking's buffers, made on the first pump() call: 0, or -1 with MemoryError set. */
static int
make_parking(Ring *r)
{
    PyObject **cp = PyMem_RawCalloc(PARK_CAP, sizeof(PyObject *));
    r->pk_buf = cp != NULL ? PyMem_RawCalloc(3 * PARK_CAP, sizeof(PyObject *)) : NULL;
    if (r->pk_buf == NULL) {
        PyMem_RawFree(cp);
        PyErr_NoMemory();
        return -1;
    }
    r->pk_cpool = cp;
    return 0;
}

/* Wait, without the GIL, for a wake or the next pass (poll_ns on, never past return_after_ns
 * from ``start``), and take the pump's flag: what it was woken for, 0 when it timed out. */
static inline int
pump_wait(Ring *r, int64_t poll_ns, int64_t after_ns, int64_t start)
{
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
    return flag;
}

/* Let the walker's lock go while another thread's drain or poll asks for it, and take it
 * back once none does. */
static inline void
yield_to_walkers(Ring *r)
{
    pthread_mutex_unlock(&r->wk);
    while (__atomic_load_n(&r->wk_wanted, __ATOMIC_SEQ_CST) > 0) {
        struct timespec pause = {0, 20000};
        nanosleep(&pause, NULL);
    }
    pthread_mutex_lock(&r->wk);
}

/* After a pass that needs no Python: why the pump comes back all the same (a drop or misuse
 * counted since ``c``, another writer than ``w0``, return_after_ns passed), or NULL. */
static inline PyObject *
pump_return_why(Ring *r, const int64_t c[4], unsigned long w0, int64_t after_ns, int64_t start)
{
    if (__atomic_load_n(&r->discarded, __ATOMIC_RELAXED) != c[0]
        || __atomic_load_n(&r->dropped_queue_full, __ATOMIC_RELAXED) != c[1]
        || __atomic_load_n(&r->unsettled, __ATOMIC_RELAXED) != c[2]
        || __atomic_load_n(&r->excepted, __ATOMIC_RELAXED) != c[3])
        return STR(pump_counts);
    if (__atomic_load_n(&r->writer, __ATOMIC_RELAXED) != w0)
        return STR(pump_writer); /* the resolver reads the new thread's times from here on */
    if (after_ns >= 0 && now_ns() - start >= after_ns)
        return STR(pump_tick);
    return NULL;
}

/* pump(poll_ns, next_trace, slow_ns, settle_ns, return_after_ns): the resolver's thread waits,
 * polls and walks here with the GIL let go, a pass every poll_ns or when woken (pump_wake, a
 * ring filling up), and comes back only for what needs Python; returns why (see pump_walk):
 * "woken", "python", "expire", "parked", "counts" (a drop or misuse was counted), "writer" (another
 * thread began a cycle), "tick" (return_after_ns passed; -1: never). next_trace: the first cycle picked for a trace (-1:
 * none); slow_ns, settle_ns: -1 for none. */
PyObject *
specobs_ring_pump(Ring *r, PyObject *const *args, Py_ssize_t nargs)
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
    if (r->pk_buf == NULL && make_parking(r) < 0)
        return NULL;
    int nev = r->ne_elapsed != NULL && r->ne_query != NULL
              && r->ne_thread == PyThread_get_thread_ident();
    const int64_t c[4] = {r->discarded, r->dropped_queue_full, r->unsettled, r->excepted};
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
        int flag = pump_wait(r, poll_ns, after_ns, start);
        if (flag & PUMP_RETURN) {
            why = STR(pump_woken);
            break;
        }
        if (__atomic_load_n(&r->wk_wanted, __ATOMIC_SEQ_CST) > 0) {
            /* Another thread's drain or poll walks first. A wake or a poll taken with it
             * stays owed (that walker stops at a deferred cycle and never expires it), so
             * the pump walks once more unless it was only asked to yield. */
            yield_to_walkers(r);
            if (flag == PUMP_YIELD)
                continue;
        }
        pthread_mutex_lock(&r->mu);
        why = pump_walk(r, next_trace, slow_ns, settle_ns, nev);
        pthread_mutex_unlock(&r->mu);
        passes++;
        if (why != NULL)
            break;
        why = pump_return_why(r, c, w0, after_ns, start);
        if (why != NULL)
            break;
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

PyObject *
specobs_ring_pump_wake(Ring *r, PyObject *Py_UNUSED(ignored))
{
    specobs_pump_signal(r, PUMP_RETURN);
    Py_RETURN_NONE;
}
