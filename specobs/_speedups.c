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
#include <stdlib.h>

typedef struct {
    double *v;
    Py_ssize_t n;
} Bounds;

static int
read_bounds(PyObject *obj, Bounds *b)
{
    PyObject *seq = PySequence_Fast(obj, "bounds must be a sequence of floats");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    b->v = PyMem_Malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    if (b->v == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    b->n = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        double x = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        if (x == -1.0 && PyErr_Occurred()) {
            PyMem_Free(b->v);
            Py_DECREF(seq);
            return -1;
        }
        if (i > 0 && !(x > b->v[i - 1])) {
            PyMem_Free(b->v);
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "bounds must be strictly increasing");
            return -1;
        }
        b->v[i] = x;
    }
    Py_DECREF(seq);
    return 0;
}

/* Index of the first bound >= x; b->n (the +Inf bucket) when there is none. A NaN compares
 * false with every bound and lands in +Inf, as bisect does with it. */
static inline Py_ssize_t
bucket_index(const Bounds *b, double x)
{
    Py_ssize_t lo = 0, hi = b->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (b->v[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
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

/* A list of the ints in counts[0..n). */
static PyObject *
count_list(const Py_ssize_t *counts, Py_ssize_t n)
{
    PyObject *lst = PyList_New(n);
    if (lst == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *c = PyLong_FromSsize_t(counts[i]);
        if (c == NULL) {
            Py_DECREF(lst);
            return NULL;
        }
        PyList_SET_ITEM(lst, i, c);
    }
    return lst;
}

/* Reads ``bounds_obj`` into ``b`` and returns a zeroed table of ``rows`` rows of b->n + 1 counts
 * (the last one +Inf); the caller frees both. NULL with an exception set, and nothing to free,
 * when the bounds are not strictly increasing floats or memory ran out. */
static Py_ssize_t *
count_table(PyObject *bounds_obj, Py_ssize_t rows, Bounds *b)
{
    if (read_bounds(bounds_obj, b) < 0)
        return NULL;
    Py_ssize_t *counts = PyMem_Calloc((size_t)(rows * (b->n + 1)), sizeof(Py_ssize_t));
    if (counts == NULL) {
        PyMem_Free(b->v);
        PyErr_NoMemory();
    }
    return counts;
}

/* (counts list, sum int) from a row of counts and a sum. */
static PyObject *
bucketed(const Py_ssize_t *counts, Py_ssize_t nb, long long sum)
{
    PyObject *lst = count_list(counts, nb);
    if (lst == NULL)
        return NULL;
    PyObject *s = PyLong_FromLongLong(sum);
    if (s == NULL) {
        Py_DECREF(lst);
        return NULL;
    }
    PyObject *t = PyTuple_Pack(2, lst, s);
    Py_DECREF(lst);
    Py_DECREF(s);
    return t;
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
    if (!PyArg_ParseTuple(args, "O!Od:bucket", &PyList_Type, &values, &bounds_obj, &scale))
        return NULL;
    Bounds b;
    Py_ssize_t *counts = count_table(bounds_obj, 1, &b);
    if (counts == NULL)
        return NULL;
    Py_ssize_t nb = b.n + 1;
    long long sum = 0;
    PyObject *result = NULL;
    Py_ssize_t n = PyList_GET_SIZE(values);
    for (Py_ssize_t j = 0; j < n; j++) {
        long long x;
        if (as_i64(PyList_GET_ITEM(values, j), &x) < 0 || add_i64(&sum, x) < 0)
            goto done;
        counts[bucket_index(&b, (double)x * scale)]++;
    }
    result = bucketed(counts, nb, sum);
done:
    PyMem_Free(counts);
    PyMem_Free(b.v);
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
    Bounds b;
    Py_ssize_t *counts = count_table(bounds_obj, nh, &b);
    if (counts == NULL)
        return NULL;
    Py_ssize_t nb = b.n + 1;
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
            counts[i * nb + bucket_index(&b, (double)d * 1e-9)]++;
            prev = t;
        }
        long long total;
        if (__builtin_sub_overflow(prev, first, &total) || add_i64(&sums[nph], total) < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_OverflowError, "cycle time overflows");
            goto done;
        }
        counts[nph * nb + bucket_index(&b, (double)total * 1e-9)]++;
    }
    hists = PyList_New(nh);
    if (hists == NULL)
        goto done;
    for (Py_ssize_t h = 0; h < nh; h++) {
        PyObject *one = bucketed(counts + h * nb, nb, sums[h]);
        if (one == NULL)
            goto done;
        PyList_SET_ITEM(hists, h, one);
    }
    result = Py_BuildValue("(OL)", hists, sums[nph]);
done:
    Py_XDECREF(hists);
    PyMem_Free(counts);
    PyMem_Free(sums);
    PyMem_Free(b.v);
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
    Py_ssize_t *counts = PyMem_Calloc((size_t)width, sizeof(Py_ssize_t));
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
    result = count_list(counts, width);
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
