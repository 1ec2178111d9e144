/* The worker's side of the ring: Ring.begin and the Cycle handle's mark, accept, end, defer and
 * settle, with what they call per cycle (the values' checks, the start of a native CUDA
 * acceptance copy, hand_on). One translation unit, so the hot path inlines as it always has:
 * the start of a CUDA acceptance copy is ring_accept_cuda.h, which only this file includes.
 *
 * Thread: the inference worker's, with the GIL held throughout. Every write to the ring happens
 * before any call into Python (the recorder's slow paths, a tensor's methods), since such a call
 * may let another thread in. Locks: the ring's (``mu``) only where a walk without the GIL may
 * move the tail at the same time (make_room on a full ring, parked_copy); never the walker's.
 */
#include "core.h"

static void hand_on(Ring *r, Slot *s);

/* -- slow paths: calls into the recorder, never raising into the worker --------------------- */

static void
report_internal(Ring *r)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *res = NULL;
    if (value != NULL)
        res = PyObject_CallMethodOneArg(r->slow, STR(internal_error), value);
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
    call_slow(r, STR(misuse), args, 2);
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

/* Store a list or tuple of exact ints in 0..k natively. 1 when stored, 0 when the resolver must
 * validate it (nothing stored), -1 on a memory error. */
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

PyObject *
specobs_cycle_mark(Cycle *self, PyObject *phase)
{
    Ring *r = self->ring;
    int64_t t = ring_now(r);
    if (self->closed) {
        PyObject *args[3] = {Py_True, phase, Py_None};
        call_slow(r, STR(misuse_mark), args, 3);
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
        call_slow(r, STR(misuse_mark), args, 3);
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
        if (d.outer && specobs_deferring == NULL)
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

PyObject *
specobs_cycle_end(Cycle *self, PyObject *Py_UNUSED(ignored))
{
    Ring *r = self->ring;
    int64_t t = ring_now(r);
    if (self->closed) {
        misuse(r, "end_without_begin", STR(msg_end_twice));
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
        call_slow(r, STR(misuse_end), &reached, 1);
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

#include "ring_accept_cuda.h"

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
        if (kw_is(name, STR(draft_length)))
            a->draft = v;
        else if (kw_is(name, STR(batch_size)))
            a->batch = v;
        else if (kw_is(name, STR(emitted)))
            a->emitted = v;
        else if (kw_is(name, STR(accepted)) && a->accepted == NULL)
            a->accepted = v;
        else if (kw_is(name, STR(accepted))) {
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
        call_slow(r, STR(oversized), args, 3);
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

/* An acceptance that is not a list or tuple: its values stored from its buffer, a CUDA
 * tensor's copy started, or what its tolist() gives read into ``*values`` (a new reference)
 * and ``*seq`` (when an exact list). 1: done with (stored, copied, refused or reported); 0: go
 * on with what was read. */
static int
accept_object(Cycle *self, Slot *s, PyObject *accepted, PyObject *draft, PyObject *emitted,
              int native_k, int64_t k, int64_t with, PyObject **values, PyObject **seq)
{
    Ring *r = self->ring;
    if (native_k && emitted == Py_None) {
        int stored = store_buffer(s, accepted, (int)k, native_most(r));
        if (stored == 1)
            return 1;
        if (stored < 0) {
            report_internal(r);
            return 1;
        }
    }
    PyObject *is_cuda = NULL;
    if (get_optional_attr(accepted, STR(is_cuda), &is_cuda) < 0) {
        report_internal(r);
        return 1;
    }
    int cuda = is_cuda != NULL && PyObject_IsTrue(is_cuda) == 1;
    Py_XDECREF(is_cuda);
    PyErr_Clear();
    if (!owns(self, s) || self->closed)
        return 1;
    if (cuda) {
        if (r->queued_bytes + with > r->max_queue_bytes) {
            refuse_payload(r, s, "bytes", r->queued_bytes + with, r->max_queue_bytes);
            return 1;
        }
        keep_draft_emitted(s, draft, emitted);
        slot_payload(r, s, with);
        accept_cuda(r, self, s, accepted, native_k && emitted == Py_None ? (int32_t)k : -1);
        return 1;
    }
    PyObject *tolist = NULL;
    if (get_optional_attr(accepted, STR(tolist), &tolist) < 0) {
        report_internal(r);
        return 1;
    }
    if (tolist != NULL) { /* numpy array or CPU tensor: copied now, the caller may reuse it */
        PyObject *v = PyObject_CallNoArgs(tolist);
        Py_DECREF(tolist);
        if (v == NULL) {
            report_internal(r);
            return 1;
        }
        if (!owns(self, s) || self->closed) {
            Py_DECREF(v);
            return 1;
        }
        if (payload_len(v) > r->max_seq) {
            Py_ssize_t got = payload_len(v);
            Py_DECREF(v);
            refuse_payload(r, s, "sequences", got, r->max_seq);
            return 1;
        }
        *values = v;
        if (PyList_CheckExact(v))
            *seq = v;
    }
    return 0;
}

/* The acceptance as a sequence (``seq``; ``values``, a new reference this takes, when tolist()
 * made it) or as the object: its lengths stored natively, else kept for the resolver's
 * validation, within what the queue may keep. */
static void
keep_acceptance(Ring *r, Slot *s, PyObject *accepted, PyObject *draft, PyObject *emitted,
                PyObject *seq, PyObject *values, int native_k, int64_t k, int64_t with)
{
    if (seq != NULL && native_k && emitted == Py_None) {
        int stored = store_lengths(s, seq, (int)k, native_most(r));
        if (stored == 1) {
            Py_XDECREF(values);
            return;
        }
        if (stored < 0) {
            Py_XDECREF(values);
            report_internal(r);
            return;
        }
    }
    /* Kept: a copy of a list or tuple (the engine may reuse it), what tolist() gave, or the
     * object itself. */
    with += payload_bytes(values != NULL ? values : seq != NULL ? seq : accepted);
    if (r->queued_bytes + with > r->max_queue_bytes) {
        Py_XDECREF(values);
        refuse_payload(r, s, "bytes", r->queued_bytes + with, r->max_queue_bytes);
        return;
    }
    PyObject *keep;
    if (values != NULL)
        keep = values;
    else if (seq != NULL) {
        keep = PyList_CheckExact(seq) ? PyList_GetSlice(seq, 0, PY_SSIZE_T_MAX)
                                      : PySequence_List(seq);
        if (keep == NULL) {
            report_internal(r);
            return;
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
}

/* accept() with its arguments read: what a caller passed is counted, never raised. */
static PyObject *
accept_parsed(Cycle *self, const AcceptArgs *a)
{
    Ring *r = self->ring;
    PyObject *accepted = a->accepted, *draft = a->draft, *batch = a->batch;
    PyObject *emitted = a->emitted;
    if (self->closed) {
        misuse(r, "bad_acceptance", STR(msg_accept_closed));
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
    if (PyList_CheckExact(accepted) || PyTuple_CheckExact(accepted))
        seq = accepted;
    else if (accept_object(self, s, accepted, draft, emitted, native_k, k, with, &values, &seq))
        Py_RETURN_NONE;
    keep_acceptance(r, s, accepted, draft, emitted, seq, values, native_k, k, with);
    Py_RETURN_NONE;
}

PyObject *
specobs_cycle_accept(Cycle *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    AcceptArgs a;
    if (parse_accept_args("Cycle.accept", args, nargs, kwnames, &a) < 0)
        return NULL;
    return accept_parsed(self, &a);
}

/* No tokens and no batch size for this cycle (its times stay). */
void
specobs_clear_acceptance(Ring *r, Slot *s)
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
            specobs_pump_signal(r, PUMP_PASS); /* the pump walks now; no Python is needed */
        else
            call_slow(r, STR(wake), NULL, 0);
    }
}

PyObject *
specobs_cycle_defer(Cycle *self, PyObject *Py_UNUSED(ignored))
{
    if (self->closed) {
        misuse(self->ring, "end_without_begin", STR(msg_defer_twice));
        return Py_NewRef(self);
    }
    self->settle_state = DEFER_AWAITING;
    PyObject *res = specobs_cycle_end(self, NULL);
    if (res == NULL)
        return NULL;
    Py_DECREF(res);
    Slot *s = slot_of(self);
    if (STATE(s) != SLOT_DEFERRED || s->idx != self->seq)
        self->settle_state = DEFER_NOTHING; /* discarded (counted there), or graph capture */
    return Py_NewRef(self);
}

PyObject *
specobs_cycle_settle(Cycle *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Ring *r = self->ring;
    AcceptArgs a;
    if (parse_accept_args("Cycle.settle", args, nargs, kwnames, &a) < 0)
        return NULL;
    int st = self->settle_state;
    if (st == DEFER_NOTHING)
        Py_RETURN_NONE;
    if (st != DEFER_AWAITING) {
        misuse(r, "bad_settle", st == DEFER_SETTLED ? STR(msg_settle_twice) : STR(msg_settle_undeferred));
        Py_RETURN_NONE;
    }
    self->settle_state = DEFER_SETTLED;
    Slot *s = slot_of(self);
    if (STATE(s) != SLOT_DEFERRED || s->idx != self->seq) {
        misuse(r, "bad_settle", STR(msg_settle_late));
        Py_RETURN_NONE;
    }
    r->deferred--;
    /* Open again for accept() only: nothing but settle() holds this handle's slot, and the
     * drain stops at an open slot as at a deferred one. */
    STATE_SET(s, SLOT_OPEN);
    self->closed = 0;
    PyObject *res;
    if (a.accepted == Py_None) {
        specobs_clear_acceptance(r, s);
        res = Py_NewRef(Py_None);
    }
    else
        res = accept_parsed(self, &a);
    self->closed = 1;
    if (owns(self, s))
        hand_on(r, s); /* else dropped by a full ring meanwhile (counted there) */
    return res;
}

PyObject *
specobs_cycle_enter(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    Py_INCREF(self);
    return self;
}

PyObject *
specobs_cycle_exit(Cycle *self, PyObject *const *args, Py_ssize_t nargs)
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
        return specobs_cycle_end(self, NULL);
    Py_RETURN_NONE;
}

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

/* begin()'s arguments, batch_size and draft_length, by position or by name, into ``*batch``
 * and ``*draft`` (left as they are when not given): 0, or -1 with a TypeError. */
static inline int
parse_begin_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **batch,
                 PyObject **draft)
{
    Py_ssize_t nk = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs > 2) {
        PyErr_SetString(PyExc_TypeError,
                        "begin() takes at most two arguments (batch_size, draft_length)");
        return -1;
    }
    if (nargs >= 1)
        *batch = args[0];
    if (nargs == 2)
        *draft = args[1];
    for (Py_ssize_t i = 0; i < nk; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (kw_is(name, STR(batch_size)) && nargs < 1)
            *batch = args[nargs + i];
        else if (kw_is(name, STR(draft_length)) && nargs < 2)
            *draft = args[nargs + i];
        else if (kw_is(name, STR(batch_size)) || kw_is(name, STR(draft_length))) {
            PyErr_Format(PyExc_TypeError, "begin() got multiple values for argument %R", name);
            return -1;
        }
        else {
            PyErr_Format(PyExc_TypeError, "begin() got an unexpected keyword argument %R", name);
            return -1;
        }
    }
    return 0;
}

/* The slot at the head opened for a cycle begun at ``t`` and the head moved past it (``*pos``:
 * where it is). */
static inline Slot *
open_slot(Ring *r, int64_t t, uint64_t *pos)
{
    Slot *s = &r->slots[r->head % (uint64_t)r->nslots];
    if (slot_holds_refs(s)) {
        /* Normally cleared when the tail passed it; dropping them may run Python code, so
         * before the slot is reserved, and the head read again after. */
        slot_clear_objs(r, s);
        drop_ref(&s->ev);
        drop_ref(&s->copy);
        s = &r->slots[r->head % (uint64_t)r->nslots];
    }
    *pos = r->head;
    s->cptr = NULL;
    s->ck = -1;
    /* Open before the head passes it: a walk without the GIL (the pump's, drain_into's) reads
     * every slot below the head, and would skip this one as void (the state a walk left it in)
     * and move the tail past the cycle for good. */
    STATE_SET(s, SLOT_OPEN);
    STORE64(&r->head, *pos + 1);
    s->ts[0] = t;
    s->tid = r->writer;
    s->nts = 1;
    s->nseq = -1;
    s->has_obj_acc = 0;
    s->batch = -1;
    s->dk = s->ak = -1;
    s->cost = 0;
    s->evn = 0;
    return s;
}

/* A sampled cycle: the recorder checks for graph capture, takes events, records the first;
 * the slot keeps them. */
static void
sample_cycle(Ring *r, Cycle *c, Slot *s, int64_t t)
{
    PyObject *tt = PyLong_FromLongLong(t);
    PyObject *ev = NULL;
    if (tt != NULL) {
        PyObject *a[2] = {r->slow, tt};
        ev = PyObject_VectorcallMethod(STR(sample), a, 2, NULL);
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

PyObject *
specobs_ring_begin(Ring *r, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    int64_t t = ring_now(r);
    PyObject *batch = Py_None, *draft = Py_None;
    if (parse_begin_args(args, nargs, kwnames, &batch, &draft) < 0)
        return NULL;
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
        Slot *old = close_open_cycle(r);
        if (old != NULL)
            discard(r, old);
        close_current(r);
        was_open = 1;
    }
    int full = make_room(r);
    uint64_t pos;
    Slot *s = open_slot(r, t, &pos);
    int64_t idx = r->begun++;
    s->idx = idx;
    if (batch != Py_None)
        set_batch(s, batch);
    if (draft != Py_None)
        set_draft_length(s, draft, r->k_max);
    Cycle *c = take_spare(r);
    if (c == NULL) {
        c = PyObject_GC_New(Cycle, &specobs_cycle_type);
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
        misuse(r, "begin_while_open", STR(msg_begin_open));
    if (full)
        call_slow(r, STR(queue_full), NULL, 0);
    if (!r->sampling && r->clock_try_at >= 0 && idx >= r->clock_try_at) {
        PyObject *i = PyLong_FromLongLong(idx);
        if (i != NULL) {
            call_slow(r, STR(try_clock), &i, 1);
            Py_DECREF(i);
        }
        else
            report_internal(r);
    }
    if (r->sampling && idx % (r->interval > 0 ? r->interval : 1) == 0)
        sample_cycle(r, c, s, t);
    return (PyObject *)c;
}
