/* Starting the native copy of a CUDA acceptance tensor: part of ring.c's translation unit,
 * included once, by ring.c, after its slow paths, so the hot path still inlines these calls.
 *
 * Thread: the inference worker's, with the GIL held; the ring's lock (``mu``) only in
 * parked_copy, where a walk without the GIL may take a parked copy at the same time. A tensor's
 * methods are Python calls: every write to the slot happens before them.
 */
#ifndef SPECOBS_CORE_RING_ACCEPT_CUDA_H
#define SPECOBS_CORE_RING_ACCEPT_CUDA_H

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

/* The address a new reference holds as an int, which it releases (``v`` NULL: the call that made
 * it failed): 0, or -1 with the error set. */
static int
address_of(PyObject *v, void **out)
{
    if (v == NULL)
        return -1;
    *out = PyLong_AsVoidPtr(v);
    Py_DECREF(v);
    return *out == NULL && PyErr_Occurred() ? -1 : 0;
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

/* What native_copy reads of the tensor, in this order: its dtype's pool (``*pool``,
 * borrowed), its length, whether it is contiguous, its device, its data pointer and the
 * device's current stream. 1: all read; 0: for the Python path; -1: an exception. */
static inline int
copy_source(Ring *r, PyObject *tensor, PyObject **pool, long long *n, void **src, void **stream)
{
    PyObject *dtype = PyObject_GetAttr(tensor, STR(dtype));
    if (dtype == NULL)
        return -1;
    *pool = PyDict_GetItemWithError(r->nc_pools, dtype); /* borrowed */
    Py_DECREF(dtype);
    if (*pool == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyList_CheckExact(*pool))
        return 0;
    int ok;
    *n = call_ll(tensor, STR(numel), &ok);
    if (!ok)
        return -1;
    if (*n < 0 || *n > r->nc_capacity)
        return 0;
    PyObject *contig = PyObject_CallMethodNoArgs(tensor, STR(is_contiguous));
    if (contig == NULL)
        return -1;
    int c = PyObject_IsTrue(contig);
    Py_DECREF(contig);
    if (c != 1)
        return c < 0 ? -1 : 0;
    long long dev = call_ll(tensor, STR(get_device), &ok);
    if (!ok)
        return -1;
    if (dev != r->nc_device)
        return 0;
    if (address_of(PyObject_CallMethodNoArgs(tensor, STR(data_ptr)), src) < 0)
        return -1;
    PyObject *devo = PyLong_FromLongLong(dev);
    PyObject *so = devo ? PyObject_CallOneArg(r->nc_stream_fn, devo) : NULL;
    Py_XDECREF(devo);
    if (address_of(so, stream) < 0)
        return -1;
    return 1;
}

/* A free pinned slot of ``pool`` into ``*slot`` (a new reference): one the pump parked, else
 * the pool's last; ``*nfree``: how many were free for the worker before it was taken. 1, 0
 * (none free) or -1 (an exception). */
static inline int
take_copy_slot(Ring *r, PyObject *pool, PyObject **slot, Py_ssize_t *nfree)
{
    *nfree = PyList_GET_SIZE(pool);
    *slot = parked_copy(r, pool);
    if (*slot != NULL)
        (*nfree)++; /* as if it had been handed back to the pool first */
    *nfree += __atomic_load_n(&r->pk_ncopies, __ATOMIC_RELAXED); /* free too, for the worker */
    if (*slot != NULL)
        return 1;
    Py_ssize_t last = PyList_GET_SIZE(pool);
    if (last == 0)
        return 0;
    *slot = PyList_GET_ITEM(pool, last - 1);
    Py_INCREF(*slot);
    if (PyList_SetSlice(pool, last - 1, last, NULL) < 0) {
        Py_DECREF(*slot);
        return -1;
    }
    return 1;
}

static int
native_copy(Ring *r, PyObject *tensor, PyObject **out, NativeCopy *nc)
{
    PyObject *pool, *slot;
    long long n;
    void *src, *stream;
    int got = copy_source(r, tensor, &pool, &n, &src, &stream);
    if (got != 1)
        return got;
    /* No Python code runs from here to the pop: the pool cannot change under it. */
    Py_ssize_t nfree;
    got = take_copy_slot(r, pool, &slot, &nfree);
    if (got != 1)
        return got;
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
    if (len == NULL || PyObject_SetAttr(slot, STR(length), len) < 0
        || PyObject_SetAttr(slot, STR(fenced), fence ? Py_True : Py_False) < 0
        || PyObject_SetAttr(slot, STR(sentinel), Py_True) < 0) {
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
        PyObject *res = PyObject_CallMethodOneArg(r->slow, STR(copy_event_failed), slot);
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
            specobs_pump_signal(r, PUMP_PASS);
        else
            call_slow(r, STR(wake), NULL, 0);
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
        copy = PyObject_CallMethodOneArg(r->slow, STR(copy_to_host), tensor);
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
            PyObject *n = PyObject_CallMethodNoArgs(tensor, STR(numel));
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

#endif
