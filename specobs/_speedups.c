/* Compiled versions of the three functions in specobs/_bucketing.py that the resolver runs for
 * every cycle, on a thread that shares the GIL with the inference worker.
 *
 * They must return exactly what the pure-Python reference returns for the same input
 * (tests/test_bucketing.py checks that on random chunks): counts per bucket with the Prometheus
 * "le" rule (a value falls in the first bucket whose bound is >= it, the last bucket is +Inf),
 * each value compared as the double (value * scale), and sums of the raw integers, exact.
 * Anything unexpected (not a list, not an int, a cycle of the wrong length, an overflow) raises,
 * and the caller falls back to the reference.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

#include "_bucket.h"

/* A histogram table: the bounds (strictly increasing floats) and ``rows`` rows of nb = n + 1
 * counts each, the last one +Inf. */
typedef struct {
    double *v;
    Py_ssize_t n;
    Py_ssize_t nb;
    int64_t *counts;
} Table;

static void
table_free(Table *t)
{
    PyMem_Free(t->counts);
    PyMem_Free(t->v);
    t->counts = NULL;
    t->v = NULL;
}

/* Reads ``bounds_obj`` into ``t`` with a zeroed table of ``rows`` rows; table_free frees both.
 * -1 with an exception set, and nothing to free, when the bounds are not strictly increasing
 * floats or memory ran out. */
static int
table_init(Table *t, PyObject *bounds_obj, Py_ssize_t rows)
{
    t->v = NULL;
    t->counts = NULL;
    PyObject *seq = PySequence_Fast(bounds_obj, "bounds must be a sequence of floats");
    if (seq == NULL)
        return -1;
    t->n = PySequence_Fast_GET_SIZE(seq);
    t->nb = t->n + 1;
    t->v = PyMem_Malloc(sizeof(double) * (size_t)(t->n > 0 ? t->n : 1));
    t->counts = PyMem_Calloc((size_t)(rows * t->nb), sizeof(int64_t));
    if (t->v == NULL || t->counts == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < t->n; i++) {
        double x = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (x == -1.0 && PyErr_Occurred())
            goto fail;
        if (i > 0 && !(x > t->v[i - 1])) {
            PyErr_SetString(PyExc_ValueError, "bounds must be strictly increasing");
            goto fail;
        }
        t->v[i] = x;
    }
    Py_DECREF(seq);
    return 0;
fail:
    Py_DECREF(seq);
    table_free(t);
    return -1;
}

/* An int, or an object with __index__ (as bytes() and the reference take them). */
static inline int
as_i64(PyObject *o, long long *out)
{
    long long x;
    if (PyLong_CheckExact(o)) {
        x = PyLong_AsLongLong(o);
    }
    else {
        PyObject *i = PyNumber_Index(o);
        if (i == NULL)
            return -1;
        x = PyLong_AsLongLong(i);
        Py_DECREF(i);
    }
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

static inline int
add_i64(long long *acc, long long x)
{
    if (__builtin_add_overflow(*acc, x, acc)) {
        PyErr_SetString(PyExc_OverflowError, "sum does not fit in 64 bits");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(bucket_doc,
"bucket(values, bounds, scale) -> (counts, sum)\n\n"
"Counts of the ints in the list ``values`` per bucket of ``bounds`` (value * scale compared,\n"
"the last count is +Inf) and the exact sum of the values.");

static PyObject *
bucket(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *values, *bounds_obj;
    double scale;
    Table t;
    if (!PyArg_ParseTuple(args, "O!Od:bucket", &PyList_Type, &values, &bounds_obj, &scale)
        || table_init(&t, bounds_obj, 1) < 0)
        return NULL;
    long long sum = 0;
    PyObject *result = NULL;
    Py_ssize_t n = PyList_GET_SIZE(values);
    for (Py_ssize_t j = 0; j < n; j++) {
        long long x;
        if (as_i64(PyList_GET_ITEM(values, j), &x) < 0 || add_i64(&sum, x) < 0)
            goto done;
        t.counts[bucket_of(t.v, t.n, (double)x * scale)]++;
    }
    result = bucketed(t.counts, t.nb, sum);
done:
    table_free(&t);
    return result;
}

PyDoc_STRVAR(host_chunk_doc,
"host_chunk(stamps, nphases, bounds) -> (histograms, total)\n\n"
"``stamps``: a list of lists of nphases + 1 int nanosecond timestamps, one per cycle.\n"
"``histograms``: (counts, sum ns) per phase, then for the whole cycle, with the phase times\n"
"compared in seconds (ns * 1e-9); ``total``: the sum of the cycle times in ns.");

static PyObject *
host_chunk(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *stamps, *bounds_obj;
    Py_ssize_t nph;
    if (!PyArg_ParseTuple(args, "O!nO:host_chunk", &PyList_Type, &stamps, &nph, &bounds_obj))
        return NULL;
    if (nph < 1 || nph > 64) {
        PyErr_SetString(PyExc_ValueError, "nphases must be 1..64");
        return NULL;
    }
    Py_ssize_t nh = nph + 1; /* the phases, then the whole cycle */
    Table tb;
    if (table_init(&tb, bounds_obj, nh) < 0)
        return NULL;
    Py_ssize_t nb = tb.nb;
    long long *sums = PyMem_Calloc((size_t)nh, sizeof(long long));
    PyObject *result = NULL, *hists = NULL;
    if (sums == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t n = PyList_GET_SIZE(stamps);
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *ts = PyList_GET_ITEM(stamps, j);
        if (!PyList_Check(ts) || PyList_GET_SIZE(ts) != nph + 1) {
            PyErr_SetString(PyExc_ValueError, "each cycle needs nphases + 1 timestamps");
            goto done;
        }
        long long first, prev, t;
        if (as_i64(PyList_GET_ITEM(ts, 0), &first) < 0)
            goto done;
        prev = first;
        for (Py_ssize_t i = 0; i < nph; i++) {
            if (as_i64(PyList_GET_ITEM(ts, i + 1), &t) < 0)
                goto done;
            long long d;
            if (__builtin_sub_overflow(t, prev, &d)) {
                PyErr_SetString(PyExc_OverflowError, "timestamp difference overflows");
                goto done;
            }
            if (add_i64(&sums[i], d) < 0)
                goto done;
            tb.counts[i * nb + bucket_of(tb.v, tb.n, (double)d * 1e-9)]++;
            prev = t;
        }
        long long total;
        if (__builtin_sub_overflow(prev, first, &total) || add_i64(&sums[nph], total) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_OverflowError, "cycle time overflows");
            goto done;
        }
        tb.counts[nph * nb + bucket_of(tb.v, tb.n, (double)total * 1e-9)]++;
    }
    hists = PyList_New(nh);
    if (hists == NULL)
        goto done;
    for (Py_ssize_t h = 0; h < nh; h++) {
        PyObject *one = bucketed(tb.counts + h * nb, nb, sums[h]);
        if (one == NULL)
            goto done;
        PyList_SET_ITEM(hists, h, one);
    }
    result = Py_BuildValue("(OL)", hists, sums[nph]);
done:
    Py_XDECREF(hists);
    PyMem_Free(sums);
    table_free(&tb);
    return result;
}

PyDoc_STRVAR(count_lengths_doc,
"count_lengths(lists, k, width) -> counts\n\n"
"How many of the ints in the lists ``lists`` equal each of 0..width-1; raises unless every\n"
"one is an int in 0..k (a bool is not: it is refused, as the reference refuses it).");

static PyObject *
count_lengths(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *lists;
    Py_ssize_t k, width;
    if (!PyArg_ParseTuple(args, "O!nn:count_lengths", &PyList_Type, &lists, &k, &width))
        return NULL;
    if (width < 1 || width > 4096 || k < 0 || k >= width) {
        PyErr_SetString(PyExc_ValueError, "need 0 <= k < width <= 4096");
        return NULL;
    }
    int64_t *counts = PyMem_Calloc((size_t)width, sizeof(int64_t));
    if (counts == NULL)
        return PyErr_NoMemory();
    PyObject *result = NULL;
    Py_ssize_t n = PyList_GET_SIZE(lists);
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *lst = PyList_GET_ITEM(lists, j);
        if (!PyList_Check(lst)) {
            PyErr_Format(PyExc_TypeError, "expected a list, got %.80s", Py_TYPE(lst)->tp_name);
            goto done;
        }
        Py_ssize_t m = PyList_GET_SIZE(lst);
        for (Py_ssize_t i = 0; i < m; i++) {
            PyObject *o = PyList_GET_ITEM(lst, i);
            long long v;
            if (!PyLong_CheckExact(o) && PyBool_Check(o)) {
                PyErr_SetString(PyExc_TypeError, "a bool is not a count");
                goto done;
            }
            if (as_i64(o, &v) < 0)
                goto done;
            if (v < 0 || v > k) {
                PyErr_Format(PyExc_ValueError, "%lld is outside 0..%zd", v, k);
                goto done;
            }
            counts[v]++;
        }
    }
    result = int64_list(counts, width);
done:
    PyMem_Free(counts);
    return result;
}

static PyMethodDef methods[] = {
    {"count_lengths", count_lengths, METH_VARARGS, count_lengths_doc},
    {"bucket", bucket, METH_VARARGS, bucket_doc},
    {"host_chunk", host_chunk, METH_VARARGS, host_chunk_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "specobs._speedups",
    "Compiled bucketing for the resolver (see specobs/_bucketing.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&module);
}
