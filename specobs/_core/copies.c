/* Native copies and the handle cache: reading a CUDA acceptance copy straight from its pinned
 * buffer and handing the buffer back to its pool, setting up the copies the worker starts in C
 * (the start itself, native_copy, is on the hot path: ring.c), and the cache of the runtime's
 * event handles, by event object, that lets the walk without the GIL read a sampled cycle's
 * times. specobs/_ring.py has no twin of these (docs/architecture.md, "C-only").
 *
 * Thread: the resolver's, with the GIL held, except specobs_handles_cached, which the pump
 * calls without it, holding the ring's lock: it reads the cache, which only the resolver's
 * thread writes, with the GIL, outside pump(). Changing the setup (set_native_copy,
 * cache_handles) takes the walker's lock, so that no pump reads what changes.
 */
#include "core.h"

/* -- reading a copy ------------------------------------------------------------------------- */

/* A read copy's pinned slot back to its free list (what its ``release`` does: a member read
 * and an append, no Python code), else to ``released`` for the resolver. -1 if an append
 * failed. With the GIL. */
int
specobs_copy_back(PyObject *copy, PyObject *released)
{
    PyObject *pool = PyObject_GetAttr(copy, STR(free));
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
int
specobs_read_copy(Ring *r, Slot *s, PyObject *released)
{
    PyObject *copy = s->copy;
    void *ptr = NULL; /* set by pinned_fields, where it succeeds */
    long isz = 0;
    Py_ssize_t n = 0;
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
    if (specobs_copy_back(copy, released) < 0)
        return -1;
    drop_ref(&s->copy);
    return rc;
}

/* -- setting up the copies the worker starts ---------------------------------------------- */

PyObject *
specobs_ring_set_native_copy(Ring *r, PyObject *args)
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
        specobs_walker_take(r);
        Parked pk = {r->pk_buf, NULL, NULL, r->pk_ncopies, 0, 0, 0, NULL};
        r->pk_ncopies = 0;
        int rc = specobs_unpark(&pk, lost);
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

/* -- the handle cache --------------------------------------------------------------------- */

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
    PyObject *o = PyObject_GetAttr(ev, STR(cuda_event));
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

void
specobs_fill_handles(Ring *r, Py_ssize_t limit)
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

void
specobs_handles_forget(Ring *r)
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

/* Without the GIL: a sampled cycle's event handles from the ring's cache, where every one of its
 * events is there (the clock's pool is fixed: after the first cycles, all are). Else the slot
 * is left for specobs_fill_handles, with the GIL. Reads the event list's items, which nobody writes
 * while the slot holds it, and the cache, which only the resolver's thread writes (with the GIL,
 * outside pump()). */
void
specobs_handles_cached(Ring *r, Slot *s)
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

/* cache_handles(events): read these event objects' handles into the cache now (the clock's
 * pool, when the native reads are set up), so that the pump finds every sampled cycle's
 * handles there from the first cycles on. Returns how many the cache holds. */
PyObject *
specobs_ring_cache_handles(Ring *r, PyObject *events)
{
    PyObject *seq = PySequence_Fast(events, "cache_handles() takes a sequence of events");
    if (seq == NULL)
        return NULL;
    specobs_walker_take(r);
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++)
        handle_of(r, PySequence_Fast_GET_ITEM(seq, i));
    walker_give(r);
    Py_DECREF(seq);
    return PyLong_FromSsize_t(r->hc_n);
}
