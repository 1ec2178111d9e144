/* The bucketing both compiled modules share: specobs/_core.c (the native ring's drain) and
 * specobs/_speedups.c (the resolver's compiled bucketing). Both must count exactly as
 * specobs/_bucketing.py does, so the rule lives once, here.
 *
 * Include after <Python.h> and <stdint.h>. Everything is static inline: each module gets its
 * own copy and no symbol is exported.
 */
#ifndef SPECOBS_BUCKET_H
#define SPECOBS_BUCKET_H

/* Index of the first of the ``n`` increasing bounds ``b`` that is >= x (the Prometheus "le"
 * rule); n (the +Inf bucket) when there is none. A NaN compares false with every bound and
 * lands in +Inf, as bisect does with it. */
static inline Py_ssize_t
bucket_of(const double *b, Py_ssize_t n, double x)
{
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (b[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* A new list of the ints in v[0..n). */
static inline PyObject *
int64_list(const int64_t *v, Py_ssize_t n)
{
    PyObject *l = PyList_New(n);
    if (l == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i]);
        if (x == NULL) {
            Py_DECREF(l);
            return NULL;
        }
        PyList_SET_ITEM(l, i, x);
    }
    return l;
}

/* One histogram as the resolver takes it: (counts list, sum int) from counts[0..n) and a sum. */
static inline PyObject *
bucketed(const int64_t *counts, Py_ssize_t n, int64_t sum)
{
    PyObject *c = int64_list(counts, n);
    if (c == NULL)
        return NULL;
    return Py_BuildValue("(NL)", c, (long long)sum);
}

#endif /* SPECOBS_BUCKET_H */
