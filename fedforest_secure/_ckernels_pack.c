/* Packed grid cells of secure aggregation (pack_cells, fedforest_secure._packing): each cell's
 * ring-encoded count and sum y checked against the task's lanes and packed into one word. */
#include "_ckernels.h"

/* For cell i of entries (count at 2i, sum at 2i + 1, uint64 ring values): the count must be
 * below count_limit and the sum, as int64, within +- count << sum_shift; then
 * out[i] = (count << s_bits) + sum modulo 2^64. Returns -1, or the first cell outside (out is
 * then partly written). The caller keeps count_limit << sum_shift below 2^62, so neither the
 * limit nor the sum plus the limit wraps. */
PyObject *pack_cells(PyObject *self, PyObject *args)
{
    PyObject *o[2];
    Py_buffer v[2];
    Py_ssize_t s_bits, sum_shift, n, i, bad = -1;
    unsigned long long count_limit;
    int got = 0;
    static const char *fmt[2] = {"Q", "Q"};
    static const char *name[2] = {"entries", "out"};
    (void)self;
    if (!PyArg_ParseTuple(args, "OOnKn", &o[0], &o[1], &s_bits, &count_limit, &sum_shift))
        return NULL;
    if (get_buffers(o, v, fmt, name, 2, 1, &got) != 0)
        goto done;
    n = v[1].len / 8;
    if (v[0].len != 2 * v[1].len || s_bits < 1 || s_bits > 63 || sum_shift < 0
        || sum_shift > 62 || count_limit == 0 || count_limit > ((uint64_t)1 << (62 - sum_shift))) {
        PyErr_SetString(PyExc_ValueError, "pack_cells: array sizes or lanes do not match");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        const uint64_t *e = v[0].buf;
        uint64_t *out = v[1].buf;
        for (i = 0; i < n; i++) {
            uint64_t c = e[2 * i], s = e[2 * i + 1], lim = c << sum_shift;
            /* s in [-lim, lim] as int64 exactly when s + lim (mod 2^64) is at most 2 lim */
            if (c >= count_limit || s + lim > 2 * lim) {
                bad = i;
                break;
            }
            out[i] = (c << s_bits) + s;
        }
    }
    Py_END_ALLOW_THREADS
done:
    return finish(v, got, PyLong_FromSsize_t(bad));
}
