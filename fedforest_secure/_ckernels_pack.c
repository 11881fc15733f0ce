/* Packed grid cells of secure aggregation (pack_cells, fedforest_secure._packing): each cell's
 * ring-encoded count and sum y packed into one word, linearly modulo 2^64. */
#include "_ckernels.h"

/* out[i] = (entries[2i] << s_bits) + entries[2i + 1] modulo 2^64, for every word of out. */
PyObject *pack_cells(PyObject *self, PyObject *args)
{
    PyObject *o[2];
    Py_buffer v[2];
    Py_ssize_t s_bits, n, i;
    int got = 0;
    static const char *fmt[2] = {"Q", "Q"};
    static const char *name[2] = {"entries", "out"};
    (void)self;
    if (!PyArg_ParseTuple(args, "OOn", &o[0], &o[1], &s_bits))
        return NULL;
    if (get_buffers(o, v, fmt, name, 2, 1, &got) != 0)
        goto done;
    n = v[1].len / 8;
    if (v[0].len != 2 * v[1].len || s_bits < 1 || s_bits > 63) {
        PyErr_SetString(PyExc_ValueError, "pack_cells: array sizes or lanes do not match");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        const uint64_t *e = v[0].buf;
        uint64_t *out = v[1].buf;
        for (i = 0; i < n; i++)
            out[i] = (e[2 * i] << s_bits) + e[2 * i + 1];
    }
    Py_END_ALLOW_THREADS
done:
    return finish(v, got, Py_NewRef(Py_None));
}
