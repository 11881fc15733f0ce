/* A worker's level pairs (fedforest_secure._level_pairs): their row statistics summed per node
 * (node_totals). */
#include "_ckernels.h"

/* The row statistics summed per node over the pairs (fedforest_secure._level_pairs.
 * node_totals): out[node[i], c] += stats[c, row[i]] * weight[i] for every pair i in order, as
 * numpy's bincount adds them, with weight[i] itself for statistic 0 when weight_first (a
 * regression's count: its statistic is 1). stats is (S, n_rows), one row per statistic; out
 * (n_nodes, S) is added to (zeros: the sums). */
PyObject *node_totals(PyObject *self, PyObject *args)
{
    PyObject *o[5];
    Py_buffer v[5];
    Py_ssize_t S, weight_first, P, nn, nr, i, c;
    int got = 0, bad = 0;
    static const char *fmt[5] = {"q", "q", "q", "d", "d"};
    static const char *name[5] = {"node", "row", "weight", "stats", "out"};
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOnn", &o[0], &o[1], &o[2], &o[3], &o[4], &S,
                          &weight_first))
        return NULL;
    if (get_buffers(o, v, fmt, name, 5, 4, &got) != 0)
        goto done;
    P = v[0].len / 8;
    nn = S > 0 ? (v[4].len / 8) / S : 0;
    nr = S > 0 ? (v[3].len / 8) / S : 0;
    if (S < 1 || S > MAX_WIDTH || v[1].len != v[0].len || v[2].len != v[0].len
        || !bytes_eq(v[3].len, S, nr, 1) || !bytes_eq(v[4].len, nn, S, 1)) {
        PyErr_SetString(PyExc_ValueError, "node_totals: array sizes do not match");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        const int64_t *node = v[0].buf, *row = v[1].buf, *wt = v[2].buf;
        const double *st = v[3].buf;
        double *out = v[4].buf;
        for (i = 0; i < P; i++) {
            int64_t nd = node[i], r = row[i];
            double w = (double)wt[i], *cell;
            if (nd < 0 || nd >= nn || r < 0 || r >= nr) {
                bad = 1;
                break;
            }
            cell = out + nd * S;
            c = 0;
            if (weight_first) {
                cell[0] += w;
                c = 1;
            }
            for (; c < S; c++)
                cell[c] += st[c * nr + r] * w;
        }
    }
    Py_END_ALLOW_THREADS
    if (bad)
        PyErr_SetString(PyExc_ValueError, "node_totals: a pair's node or row is out of range");
done:
    return finish(v, got, Py_NewRef(Py_None));
}
