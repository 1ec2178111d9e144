/* Clocks and CUDA events: the poll (Ring.poll, stage 1 of the resolver: which waiting cycles
 * completed on the GPU), a sampled cycle's GPU times read through the runtime's own functions,
 * setting those functions up, and a fake runtime's functions for the tests. The clock the ring
 * stamps with (now_ns, ring_now) is in core.h, for the hot path to inline.
 *
 * Thread: the resolver's, with the GIL held, except specobs_read_gpu, which a walk without the
 * GIL calls too (it calls no Python API). The poll holds the walker's lock (specobs_walker_take);
 * the clock's query is Python code, during which the worker may run and move the ring.
 */
#include "core.h"

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

/* Whether a copy filled with the sentinel has every value written over it (1), not yet or
 * without a sentinel (0), or an error (-1): what its ``landed()`` says, read here from pinned
 * memory for the clock's own copy type, without a Python call. */
static int
copy_landed(Ring *r, PyObject *copy)
{
    if (r->copy_type == NULL || Py_TYPE(copy) != (PyTypeObject *)r->copy_type)
        return truth_of(PyObject_CallMethodNoArgs(copy, STR(landed)));
    int sent = attr_true(copy, STR(sentinel));
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
    return h->cptr != NULL ? 1 : attr_true(h->copy, STR(sentinel));
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
    return h->cptr != NULL ? h->cfenced : attr_true(h->copy, STR(fenced));
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
        ev = PyObject_GetAttr(h->copy, STR(event));
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

/* The first held cycle not known complete without the driver: the newest copy whose values
 * landed over the sentinel completed, and so did everything before it on the stream (a binary
 * search over the copies filled with the sentinel, their positions written to ``pos``). -1 on
 * an error. */
static Py_ssize_t
landed_start(Ring *r, Held *hv, Py_ssize_t nh, PyObject *query, Py_ssize_t *pos)
{
    Py_ssize_t nc = 0;
    for (Py_ssize_t i = 0; i < nh; i++) {
        if (hv[i].copy == NULL)
            continue;
        int t = held_sentinel(&hv[i]);
        if (t < 0)
            return -1;
        if (t)
            pos[nc++] = i;
    }
    Py_ssize_t lo = first_false(r, query, hv, pos, nc, held_landed_test);
    if (lo < 0)
        return -1;
    Py_ssize_t start = 0;
    if (lo > 0) {
        Py_ssize_t j = pos[lo - 1];
        start = hv[j].ev != NULL ? j : j + 1; /* events are recorded after the copy */
    }
    return start;
}

/* The poll on one stream (see Ring.poll): the index bound, or -1 on an error. */
static int64_t
poll_held(Ring *r, Held *hv, Py_ssize_t nh, int64_t bound, PyObject *query, long polls_before)
{
    Py_ssize_t *pos = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(nh ? nh : 1));
    if (pos == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int64_t out = -1;
    /* Without the driver first. */
    Py_ssize_t start = landed_start(r, hv, nh, query, pos);
    if (start < 0)
        goto done;
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
    /* The first whose event is to come. */
    Py_ssize_t lo = first_false(r, query, hv, pos, nt, held_done);
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
        specobs_fill_handles(r, cap); /* may run Python: before any slot is looked at below */
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

/* poll(), with the walker's lock: the pump, if one runs, comes back first. */
PyObject *
specobs_ring_poll(Ring *r, PyObject *const *args, Py_ssize_t nargs)
{
    specobs_walker_take(r);
    PyObject *out = poll_walked(r, args, nargs);
    walker_give(r);
    return out;
}

/* -- GPU times through the runtime --------------------------------------------------------- */

/* A sampled cycle's GPU phase times through the runtime (every event of it completed: the
 * poll's bound says so), as the clock's ``elapsed_ns`` reads them: milliseconds as a float,
 * rounded half to even to integer ns. Calls no Python API. -1 when the runtime refuses one
 * or a time is negative (the resolver reads those in Python, and says why). */
int
specobs_read_gpu(Ring *r, const Slot *s, int64_t *g, int64_t *sum)
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

PyObject *
specobs_ring_set_native_events(Ring *r, PyObject *args)
{
    unsigned long long elapsed_addr = 0, lasterr_addr = 0, query_addr = 0;
    if (!PyArg_ParseTuple(args, "|KKK:set_native_events", &elapsed_addr, &lasterr_addr,
                          &query_addr))
        return NULL;
    specobs_walker_take(r); /* the pump reads these and the handle cache */
    r->ne_elapsed = (int (*)(float *, void *, void *))(uintptr_t)elapsed_addr;
    r->ne_lasterr = (int (*)(void))(uintptr_t)lasterr_addr;
    r->ne_query = elapsed_addr ? (int (*)(void *))(uintptr_t)query_addr : NULL;
    specobs_handles_forget(r); /* another clock's events, or none */
    r->ne_thread = PyThread_get_thread_ident();
    walker_give(r);
    Py_RETURN_NONE;
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

PyObject *
specobs_fake_event_fns(PyObject *Py_UNUSED(m), PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(KKK)", (unsigned long long)(uintptr_t)fake_event_elapsed,
                         (unsigned long long)(uintptr_t)fake_last_error,
                         (unsigned long long)(uintptr_t)fake_event_query);
}
