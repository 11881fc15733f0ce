/* Packed grid cells of secure aggregation (pack_cells, fedforest_secure._packing): each cell's
 * ring-encoded count and sum y packed into one word, linearly modulo 2^64; and a worker's
 * routing of its pairs through numeric splits (route_pairs, fedforest_secure._routing). */
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

/* A worker's routing of its pairs through numeric splits (fedforest_secure._routing.route):
 * pair p (node[p], row[p]) goes to left[nd] where its code codes[fbase[nd] + row[p]] is below
 * cut[nd], else to right[nd] (nd = node[p]; -1 for both where the node is a leaf): out[p].
 * node, row and codes are int32; fbase, cut, left, right (one per node) and out int64. */
PyObject *route_pairs(PyObject *self, PyObject *args)
{
    PyObject *oi[3], *o[5];
    Py_buffer vi[3], v[5];
    Py_ssize_t P, nn, nc, p;
    int k, goti = 0, got = 0, bad = 0;
    static const char *iname[3] = {"node", "row", "codes"};
    static const char *fmt[5] = {"q", "q", "q", "q", "q"};
    static const char *name[5] = {"fbase", "cut", "left", "right", "out"};
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOOO", &oi[0], &oi[1], &oi[2], &o[0], &o[1], &o[2],
                          &o[3], &o[4]))
        return NULL;
    for (k = 0; k < 3; k++, goti++)
        if (get_i32(oi[k], &vi[k], iname[k]) != 0)
            goto done;
    if (get_buffers(o, v, fmt, name, 5, 4, &got) != 0)
        goto done;
    P = vi[0].len / 4;
    nn = v[0].len / 8;
    nc = vi[2].len / 4;
    if (vi[1].len != vi[0].len || v[1].len != v[0].len || v[2].len != v[0].len
        || v[3].len != v[0].len || v[4].len != 8 * P) {
        PyErr_SetString(PyExc_ValueError, "route_pairs: array sizes do not match");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        const int32_t *node = vi[0].buf, *row = vi[1].buf, *codes = vi[2].buf;
        const int64_t *fbase = v[0].buf, *cut = v[1].buf, *left = v[2].buf,
                      *right = v[3].buf;
        int64_t *out = v[4].buf;
        for (p = 0; p < P; p++) {
            int64_t nd = node[p], at;
            if (nd < 0 || nd >= nn) {
                bad = 1;
                break;
            }
            at = fbase[nd] + (int64_t)row[p];
            if (at < 0 || at >= nc) {
                bad = 1;
                break;
            }
            out[p] = (int64_t)codes[at] < cut[nd] ? left[nd] : right[nd];
        }
    }
    Py_END_ALLOW_THREADS
    if (bad)
        PyErr_SetString(PyExc_ValueError, "route_pairs: a pair's node or row is out of range");
done:
    for (k = 0; k < goti; k++)
        PyBuffer_Release(&vi[k]);
    return finish(v, got, Py_NewRef(Py_None));
}
