/* The module: the Ring and Cycle types (their tables, construction, garbage collection,
 * attributes), the resolver's small queue operations (counters, clear_queue, expire,
 * take_dropped), the interned strings and the module's init. The methods themselves live by
 * concern: ring.c (the worker's side), events.c (the poll, GPU times), copies.c (native copies,
 * the handle cache), drain.c (the drains with the GIL), pump.c (the walk without it, the pump).
 *
 * Everything here runs with the GIL held. clear_queue and expire move the tail, so they hold the
 * ring's lock (a walk without the GIL may be moving it too); Ring_clear and Ring_dealloc run
 * when nobody else can reach the ring.
 */
#include "core.h"

#include <stddef.h>

uint64_t specobs_fork_gen = 0;
PyObject *specobs_deferring = NULL;
SpecobsStrings specobs_strings;

/* -- Cycle: the type (its methods are the worker's, in ring.c) ------------------------------ */

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
    {"mark", (PyCFunction)specobs_cycle_mark, METH_O,
     "mark($self, phase, /)\n--\n\n"
     "End the running phase and start ``phase`` (the next one in the configured order)."},
    {"accept", (PyCFunction)(void (*)(void))specobs_cycle_accept, METH_FASTCALL | METH_KEYWORDS,
     "accept($self, accepted, *, draft_length=None, batch_size=None, emitted=None)\n--\n\n"
     "Record acceptance for this cycle (see specobs.CycleHandle.accept)."},
    {"end", (PyCFunction)specobs_cycle_end, METH_NOARGS, "End the last phase and hand the cycle on."},
    {"defer", (PyCFunction)specobs_cycle_defer, METH_NOARGS,
     "End the cycle with its acceptance to come from settle(); returns the handle."},
    {"settle", (PyCFunction)(void (*)(void))specobs_cycle_settle, METH_FASTCALL | METH_KEYWORDS,
     "settle($self, accepted, *, draft_length=None, batch_size=None, emitted=None)\n--\n\n"
     "Give a deferred cycle its acceptance (None: no tokens) and hand it on."},
    {"__enter__", specobs_cycle_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))specobs_cycle_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Cycle_members[] = {
    {"index", T_LONGLONG, offsetof(Cycle, index), READONLY, "the cycle's index"},
    {"_closed", T_INT, offsetof(Cycle, closed), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject specobs_cycle_type = {
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

/* The counts the resolver folds and the sampler reads after each drain, in one call: (discarded,
 * dropped_queue_full, unsettled, native_gpu_cycles, native_gpu_cost, excepted). */
static PyObject *
Ring_counters(Ring *r, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(LLLLLL)", (long long)r->discarded, (long long)r->dropped_queue_full,
                         (long long)r->unsettled, (long long)r->ne_cycles, (long long)r->ne_cost,
                         (long long)r->excepted);
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
        specobs_clear_acceptance(r, s);
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
    r->slow = Py_NewRef(slow);
    r->phases = Py_NewRef(phases);
    r->null_cycle = Py_NewRef(null_cycle);
    r->record_fn = Py_NewRef(Py_None);
    r->stream = Py_NewRef(Py_None);
    r->copy_type = Py_NewRef(Py_None);
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
    specobs_handles_forget(r);
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
        Slot *s = close_open_cycle(r);
        if (s != NULL)
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

static PyMethodDef Ring_methods[] = {
    {"counters", (PyCFunction)Ring_counters, METH_NOARGS,
     "counters(): (discarded, dropped_queue_full, unsettled, native_gpu_cycles, "
     "native_gpu_cost, excepted), read together."},
    {"set_native_events", (PyCFunction)specobs_ring_set_native_events, METH_VARARGS,
     "set_native_events(elapsed, get_last_error[, query]): read sampled cycles' GPU times in "
     "drain_into, and ask their events in poll, through these runtime functions "
     "(cudaEventElapsedTime, cudaGetLastError, cudaEventQuery), on the calling thread only "
     "(0: turn it off)."},
    {"set_native_copy", (PyCFunction)specobs_ring_set_native_copy, METH_VARARGS,
     "Start CUDA acceptance copies in C through these runtime functions (0: turn it off)."},
    {"begin", (PyCFunction)(void (*)(void))specobs_ring_begin, METH_FASTCALL | METH_KEYWORDS,
     "begin(batch_size=None, draft_length=None)\n--\n\nStart a cycle (and its first phase); "
     "returns its handle. draft_length: the k the engine scheduled for this cycle's draft "
     "phase (0: a step that drafts nothing)."},
    {"pending", (PyCFunction)specobs_ring_pending, METH_O, NULL},
    {"poll", (PyCFunction)(void (*)(void))specobs_ring_poll, METH_FASTCALL,
     "poll(limit, query, polls_before_query): the bound below which the first limit waiting "
     "cycles completed on the GPU, on one stream."},
    {"drain", (PyCFunction)(void (*)(void))specobs_ring_drain, METH_FASTCALL, NULL},
    {"drain_into", (PyCFunction)(void (*)(void))specobs_ring_drain_into, METH_FASTCALL, NULL},
    {"totals", (PyCFunction)specobs_ring_totals, METH_NOARGS, NULL},
    {"reset_totals", (PyCFunction)specobs_ring_reset_totals, METH_NOARGS, NULL},
    {"clear_queue", (PyCFunction)Ring_clear_queue, METH_NOARGS, NULL},
    {"take_dropped", (PyCFunction)Ring_take_dropped, METH_NOARGS, NULL},
    {"expire", (PyCFunction)Ring_expire, METH_O,
     "expire(timeout_ns): hand on, unsettled, the deferred cycles ended that long ago."},
    {"forget_current", (PyCFunction)Ring_forget_current, METH_NOARGS, NULL},
    {"pump", (PyCFunction)(void (*)(void))specobs_ring_pump, METH_FASTCALL,
     "pump(poll_ns, next_trace, slow_ns, settle_ns, return_after_ns): wait, poll and walk with "
     "the GIL let go until Python is needed; returns why."},
    {"cache_handles", (PyCFunction)specobs_ring_cache_handles, METH_O,
     "cache_handles(events): read these events' handles into the ring's cache now."},
    {"pump_wake", (PyCFunction)specobs_ring_pump_wake, METH_NOARGS,
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

static PyMethodDef core_methods[] = {
    {"_fake_event_fns", specobs_fake_event_fns, METH_NOARGS,
     "Tests: (elapsed, get_last_error, query) of a fake runtime whose event handles point at "
     "(ts, recorded, &completed) int64 fields."},
    {"set_detail_type", specobs_set_detail_type, METH_O,
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

/* Where each string of SPECOBS_STRINGS goes in specobs_strings, and its text. */
#define SPECOBS_STRING_ENTRY(field, text) {offsetof(SpecobsStrings, field), text},
static const struct {
    size_t at;
    const char *text;
} string_table[] = {SPECOBS_STRINGS(SPECOBS_STRING_ENTRY)};

/* Intern every string of SPECOBS_STRINGS; -1 with the error set. */
static int
intern_strings(void)
{
    for (size_t i = 0; i < sizeof(string_table) / sizeof(string_table[0]); i++) {
        PyObject *s = PyUnicode_InternFromString(string_table[i].text);
        if (s == NULL)
            return -1;
        *(PyObject **)((char *)&specobs_strings + string_table[i].at) = s;
    }
    return 0;
}

static void
bump_fork_gen(void)
{
    __atomic_add_fetch(&specobs_fork_gen, 1, __ATOMIC_RELAXED);
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
    if (intern_strings() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&core_module);
    if (m == NULL)
        return NULL;
    /* Each readied and added under its own name (Ring, Cycle). */
    if (PyModule_AddType(m, &RingType) < 0 || PyModule_AddType(m, &specobs_cycle_type) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
