/* The drains with the GIL: Ring.drain (one chunk, its totals handed over) and Ring.drain_into
 * (the resolver's path, into the ring's running totals), Ring.pending, the running totals read
 * and reset, and the details a drain hands the resolver for the cycles that need Python.
 * drain_into hands the common case to the walk without the GIL (pump.c) in rounds.
 *
 * Thread: the resolver's, with the GIL held and the walker's lock (specobs_walker_take), so no pump
 * walks meanwhile. drain_loop makes no call into Python while it moves the tail: what it lets
 * go of is deferred (Deferral) until the ring is consistent again. The running totals are read
 * and reset under the ring's lock, since a walk without the GIL may be adding to them.
 */
#include "core.h"

/* -- Ring.pending --------------------------------------------------------------------------- */

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

/* -- the details handed over --------------------------------------------------------------- */

/* The class of the details a drain hands over: specobs._ring.Detail, a tuple subclass whose
 * fields name the positions below (set once by specobs/_ring.py); NULL: plain tuples. */
static PyTypeObject *detail_type = NULL;
#define DETAIL_FIELDS 13

PyObject *
specobs_set_detail_type(PyObject *Py_UNUSED(m), PyObject *cls)
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

/* -- the drain ------------------------------------------------------------------------------ */

/* What drain() and drain_into() are asked: drain(bound, limit, trace, slow_ns, want_all). */
typedef struct {
    long long bound, slow_ns;
    Py_ssize_t limit;
    PyObject *trace; /* the cycles picked for a trace: a sorted list of indices (borrowed) */
    int want_all;
} DrainArgs;

static int
drain_args(PyObject *const *args, Py_ssize_t nargs, DrainArgs *a)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "drain(bound, limit, trace, slow_ns, want_all)");
        return -1;
    }
    a->bound = PyLong_AsLongLong(args[0]);
    a->limit = PyLong_AsSsize_t(args[1]);
    a->trace = args[2];
    a->slow_ns = PyLong_AsLongLong(args[3]);
    a->want_all = PyObject_IsTrue(args[4]);
    if (PyErr_Occurred())
        return -1;
    if (!PyList_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "trace must be a list of cycle indices");
        return -1;
    }
    return 0;
}

/* Whether cycle ``idx`` is in the sorted trace list, looked at from entry ``*ti`` on (moved past
 * every entry up to ``idx``): 1, 0, or -1 on an error. */
static int
trace_picks(PyObject *trace, Py_ssize_t *ti, int64_t idx)
{
    int picked = 0;
    for (; *ti < PyList_GET_SIZE(trace); (*ti)++) {
        long long want = PyLong_AsLongLong(PyList_GET_ITEM(trace, *ti));
        if (want == -1 && PyErr_Occurred())
            return -1;
        if (want > idx)
            break;
        if (want == idx)
            picked = 1;
    }
    return picked;
}

/* drain_into, on the thread the runtime reads on: a sampled cycle that needs Python for nothing
 * else has its GPU times read here, into the totals, and its events go back to the resolver to
 * release (a slow one stays a detail: it is traced). Whether they were read. */
static int
gpu_read_here(Ring *r, Totals *t, const Slot *s, long long slow_ns, PyObject *released)
{
    int64_t g[MAX_PHASES], gsum;
    int read = 0;
    if (specobs_read_gpu(r, s, g, &gsum) == 0 && !(slow_ns >= 0 && gsum >= slow_ns)
        && PyList_Append(released, s->ev) == 0) {
        add_gpu(r, t, g, gsum);
        r->ne_cycles++;
        r->ne_cost += s->cost;
        read = 1;
    }
    PyErr_Clear();
    return read;
}

/* The drain itself: consume the done cycles with index < a->bound, at most ``limit``, into
 * ``t``; append the cycles that need Python to ``details`` and the copies read here to
 * ``released``. Makes no call into Python (the worker cannot run in between). Sets the cycles
 * taken and the sum of their host cycle times; -1 on an error. */
static int
drain_cycles(Ring *r, Totals *t, const DrainArgs *a, Py_ssize_t limit, PyObject *details,
             PyObject *released, Py_ssize_t *n_out, int64_t *total_out, int yield_to_walk,
             int nev)
{
    int nph = r->nph;
    int64_t total = 0;
    Py_ssize_t n = 0, ti = 0;
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
        if (STATE(s) != SLOT_DONE || s->idx >= a->bound)
            break;
        ADDN(&r->nheld, -(Py_ssize_t)(s->ev != NULL || s->copy != NULL));
        int64_t tot = add_host(r, t, s->ts);
        total += tot;
        add_gap(r, t, s);
        int py_batch = 0;
        if (s->copy != NULL && s->nseq < 0 && s->acc == NULL && r->copy_type != Py_None
            && (PyObject *)Py_TYPE(s->copy) == r->copy_type) {
            if (specobs_read_copy(r, s, released) < 0)
                PyErr_Clear();
        }
        add_acceptance(t, s);
        int32_t ck = slot_cycle_k(s);
        add_by_k(r, t, s);
        if (s->batch_obj != NULL || s->has_obj_acc)
            py_batch = 1; /* sized by the resolver's validation */
        else
            add_batch(r, t, s);
        int traced = trace_picks(a->trace, &ti, s->idx);
        if (traced < 0)
            return -1;
        if (a->slow_ns >= 0 && s->ev == NULL && tot >= a->slow_ns) /* GPU-timed: by GPU time */
            traced = 1;
        int gpu_read = 0;
        if (nev && s->ev != NULL && s->evn == nph + 1 && !a->want_all && !traced && !py_batch
            && s->copy == NULL && s->acc == NULL && s->emitted == NULL && s->dk_obj == NULL)
            gpu_read = gpu_read_here(r, t, s, a->slow_ns, released);
        if (a->want_all || traced || py_batch || (s->ev != NULL && !gpu_read) || s->copy != NULL
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

/* drain_cycles with what it lets go of deferred until the ring is consistent again. */
static int
drain_loop(Ring *r, Totals *t, const DrainArgs *a, Py_ssize_t limit, PyObject *details,
           PyObject *released, Py_ssize_t *n_out, int64_t *total_out, int yield_to_walk,
           int nev)
{
    Deferral d;
    defer_begin(&d);
    int rc = drain_cycles(r, t, a, limit, details, released, n_out, total_out, yield_to_walk,
                          nev);
    defer_end(&d);
    return rc;
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
drain_chunk(Ring *r, DrainArgs *a, PyObject *details, PyObject *released)
{
    Py_ssize_t n = 0;
    int64_t total = 0;
    Totals *t = PyMem_Calloc(1, sizeof(Totals));
    PyObject *out = NULL;
    if (t == NULL || details == NULL || released == NULL) {
        if (t == NULL)
            PyErr_NoMemory();
        goto done;
    }
    if (drain_loop(r, t, a, a->limit, details, released, &n, &total, 0, 0) < 0)
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
    return out;
}

/* The same drain into the ring's running totals (read with ``totals``): the resolver's path,
 * which hands the aggregation nothing for the cycles that need no Python. Returns
 * (cycles, total ns, details, copies read here to release). */
static PyObject *
drain_running(Ring *r, DrainArgs *a, PyObject *details, PyObject *released)
{
    Py_ssize_t n = 0;
    int64_t total = 0;
    PyObject *out = NULL;
    int rc = details != NULL && released != NULL ? 0 : -1;
    int walk = !a->want_all;
    /* What the pump walked since the last call (its cycles are in the totals already), and the
     * references it parked, handed back now: counted in this drain's cycles and host time. */
    Py_ssize_t pumped = (Py_ssize_t)r->pump_cycles;
    int64_t pumped_ns = r->pump_total;
    r->pump_cycles = r->pump_total = 0;
    if (rc == 0 && r->pk_buf != NULL) {
        Parked pk = parking_of(r, NULL);
        r->pk_ncopies = r->pk_ndrafts = r->pk_nevents = 0;
        if (specobs_unpark(&pk, released) < 0)
            PyErr_Clear(); /* a reference not handed back is let go of: its pool is smaller */
    }
    /* Sampled cycles' GPU times are read natively only on the thread the clock set up for
     * them (the resolver's: its current device is the clock's). */
    int nev = r->ne_elapsed != NULL && r->ne_thread == PyThread_get_thread_ident();
    r->walk_count = r->walk_hold_ns = 0;
    /* Only the cycles begun before this call: one a finalizer run between two rounds begins
     * waits for the next drain, as it does when the drain is one pass. */
    if (a->bound > r->begun)
        a->bound = r->begun;
    /* Rounds: the walk without the GIL takes the common case, the drain with it the cycles that
     * need Python, until the chunk is full or nothing more is ready. */
    while (rc == 0 && n < a->limit) {
        int64_t wtotal = 0, gtotal = 0;
        if (nev && LOADN(&r->nheld) > 0)
            specobs_fill_handles(r, a->limit - n);
        Py_ssize_t nw = walk ? specobs_drain_nogil(r, a->bound, a->limit - n, a->trace,
                                                   a->slow_ns, nev, released, &wtotal)
                             : 0;
        if (nw < 0) {
            nw = 0;
            PyErr_Clear(); /* nothing was walked: the drain below takes the cycles instead */
        }
        n += nw;
        total += wtotal;
        if (n >= a->limit)
            break;
        Py_ssize_t ng = 0;
        rc = drain_loop(r, r->totals, a, a->limit - n, details, released, &ng, &gtotal, walk,
                        nev);
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
    return out;
}

/* -- the methods, each with the walker's lock: the pump, if one runs, comes back first ------- */

/* drain() or drain_into(): the arguments read, and ``body`` given the lists it fills (NULL where
 * one could not be made: ``body`` says so). */
static PyObject *
drain_call(Ring *r, PyObject *const *args, Py_ssize_t nargs,
           PyObject *(*body)(Ring *, DrainArgs *, PyObject *, PyObject *))
{
    DrainArgs a;
    PyObject *out = NULL;
    specobs_walker_take(r);
    if (drain_args(args, nargs, &a) == 0) {
        PyObject *details = PyList_New(0), *released = PyList_New(0);
        out = body(r, &a, details, released);
        Py_XDECREF(details);
        Py_XDECREF(released);
    }
    walker_give(r);
    return out;
}

PyObject *
specobs_ring_drain(Ring *r, PyObject *const *args, Py_ssize_t nargs)
{
    return drain_call(r, args, nargs, drain_chunk);
}

PyObject *
specobs_ring_drain_into(Ring *r, PyObject *const *args, Py_ssize_t nargs)
{
    return drain_call(r, args, nargs, drain_running);
}

PyObject *
specobs_ring_pending(Ring *r, PyObject *arg)
{
    specobs_walker_take(r);
    PyObject *out = pending_walked(r, arg);
    walker_give(r);
    return out;
}

/* -- the running totals ------------------------------------------------------------------- */

/* The running totals of ``drain_into``: (cycles, host, length counts, accepted, drafted,
 * emitted, {draft length: sequences}, batch (counts, sum), batch count, last end stamp or
 * None, GPU [(counts, sum)] per phase then the cycle: the sampled cycles it read itself). */
PyObject *
specobs_ring_totals(Ring *r, PyObject *Py_UNUSED(ignored))
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
PyObject *
specobs_ring_reset_totals(Ring *r, PyObject *Py_UNUSED(ignored))
{
    ring_lock(r);
    memset(r->totals, 0, sizeof(Totals));
    r->gap_n = 0;
    r->gap_next = -1;
    ring_unlock(r);
    Py_RETURN_NONE;
}
