/* Compiled loops of the engine's hot paths, module fedforest_secure._ckernels: the pooled-CDF
 * candidates (fedforest_secure._sketch), a worker's level-order keys, quantile points and
 * histograms (fedforest_secure._order, _level_stats, _grid_stats), the secure sketch's prior
 * and picks (fedforest_secure._secure_cdf), and the fixed-point encoding of secure aggregation
 * (fedforest_secure.secagg._primitives._ring) with its packed grid cells
 * (fedforest_secure._packing), a worker's routing (fedforest_secure._routing) and node totals
 * (fedforest_secure._level_pairs), and the coordinator's split scores of a regression's
 * (n, sum y) histograms (fedforest_secure._splits). The loops are in _ckernels_sketch.c,
 * _ckernels_order.c, _ckernels_stats.c, _ckernels_pack.c, _ckernels_split.c and
 * _ckernels_pairs.c; this file holds the helpers they share and the module's table.
 *
 * Each loop computes what the numpy function beside its caller computes, every floating-point
 * operation the same one in the same order (running sums sequential, as numpy's cumsum), so
 * both give the same bits; the module is built with -ffp-contract=off so that no multiply-add
 * is fused. The numpy code is the reference and the fallback where this module is not built
 * (tests/test_sketch_kernels.py compares them).
 *
 * Arrays come through the buffer protocol (C-contiguous); every size is checked without
 * overflow and every index read from an array is bounds-checked; the GIL is released while
 * the loops run.
 */
#include "_ckernels.h"

int get_buffer(PyObject *obj, Py_buffer *view, const char *fmt, int writable,
                      const char *name)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0)
        return -1;
    /* "d": float64; "q": int64, which numpy may call "l" (a 64-bit long); "Q": uint64 ("L") */
    if (view->itemsize != 8
        || (strcmp(view->format, fmt) != 0
            && !(fmt[0] == 'q' && strcmp(view->format, "l") == 0)
            && !(fmt[0] == 'Q' && strcmp(view->format, "L") == 0))) {
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous array of format %s",
                     name, fmt);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* get_buffer for n arrays in turn (array `writable` writable, -1: none); *got counts those
 * held, for finish() to release whatever happens. */
int get_buffers(PyObject **o, Py_buffer *v, const char *const *fmt,
                       const char *const *name, int n, int writable, int *got)
{
    for (*got = 0; *got < n; (*got)++)
        if (get_buffer(o[*got], &v[*got], fmt[*got], *got == writable, name[*got]) != 0)
            return -1;
    return 0;
}

/* The end of a call: the n buffers released, then its result, or NULL (result dropped)
 * where an error was set. */
PyObject *finish(Py_buffer *v, int n, PyObject *result)
{
    int k;
    for (k = 0; k < n; k++)
        PyBuffer_Release(&v[k]);
    if (PyErr_Occurred()) {
        Py_XDECREF(result);
        return NULL;
    }
    return result;
}

/* 1 if len (bytes) is exactly 8 * a * b * c, every factor >= 0, computed without overflow */
int bytes_eq(Py_ssize_t len, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c)
{
    Py_ssize_t t;
    if (a < 0 || b < 0 || c < 0 || __builtin_mul_overflow(a, b, &t)
        || __builtin_mul_overflow(t, c, &t) || __builtin_mul_overflow(t, (Py_ssize_t)8, &t))
        return 0;
    return t == len;
}

/* 1 if len (bytes) is at least 8 * a * b, without overflow */
int bytes_at_least(Py_ssize_t len, Py_ssize_t a, Py_ssize_t b)
{
    Py_ssize_t t;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &t)
        || __builtin_mul_overflow(t, (Py_ssize_t)8, &t))
        return 0;
    return len >= t;
}

/* which compiled variant reads fields of these item sizes: 8 (a packed key), 2 (compact
 * arrays: codes and rows of 16 bits, weights of 8), 0 (any) */
int layout_of(const field *code, const field *row, const field *w)
{
    if (code->size == 8 && row->size == 8 && w->size == 8)
        return 8;
    if (code->size == 2 && row->size == 2 && w->size == 1)
        return 2;
    return 0;
}

/* a C-contiguous array's buffer and its format without a byte-order prefix ("<", "=",
 * "@": native order on this machine), or NULL with the buffer protocol's error set */
const char *native_format(PyObject *obj, Py_buffer *view)
{
    const char *fmt;
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0)
        return NULL;
    fmt = view->format;
    if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@')
        fmt++;
    return fmt;
}

/* a C-contiguous int32 array's buffer (numpy's "i"), or -1 with TypeError */
int get_i32(PyObject *obj, Py_buffer *view, const char *name)
{
    const char *fmt = native_format(obj, view);
    if (fmt == NULL)
        return -1;
    if (view->itemsize != 4 || strcmp(fmt, "i") != 0) {
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous int32 array", name);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* the buffer of a C-contiguous integer array (signed or unsigned, 1, 2, 4 or 8 bytes) */
int get_field(PyObject *obj, Py_buffer *view, Py_ssize_t shift, unsigned long long mask,
                     field *f, const char *name)
{
    const char *fmt = native_format(obj, view);
    if (fmt == NULL)
        return -1;
    /* unsigned below 8 bytes (a signed byte of -3 is not a weight of 253); 8 bytes either */
    if (strlen(fmt) != 1 || strchr(view->itemsize == 8 ? "lLqQ" : "BHI", fmt[0]) == NULL
        || (view->itemsize != 1 && view->itemsize != 2 && view->itemsize != 4
            && view->itemsize != 8) || shift < 0 || shift > 63) {
        PyErr_Format(PyExc_TypeError, "%s: expected a C-contiguous integer array (unsigned "
                     "below 8 bytes)", name);
        PyBuffer_Release(view);
        return -1;
    }
    f->p = view->buf;
    f->n = view->len / view->itemsize;
    f->size = (int)view->itemsize;
    f->shift = (int)shift;
    f->mask = (uint64_t)mask;
    return 0;
}

static PyMethodDef methods[] = {
    {"pooled_rows", pooled_rows, METH_VARARGS,
     "pooled_rows(points, weights, out, R, K, P, n_bins): the pooled-CDF candidates of R rows "
     "(points (R, K, P), weights (R, K) summing to 1 per row) written into out (R, n_bins - 1)."},
    {"pooled_lists", pooled_lists, METH_VARARGS,
     "pooled_lists(lists, weights, keep, out, R, K, P, n_bins): pooled_rows of the rows with "
     "keep[r] != 0, client c's lists the (R, P) array lists[c]."},
    {"sketch_values", sketch_values, METH_VARARGS,
     "sketch_values(weights, shift, mask, codes, shift, mask, edges, wanted, feat, uniq_off, "
     "uniq_all, missing, out, n_points, r): every wanted block's quantile points into out."},
    {"histogram_blocks", histogram_blocks, METH_VARARGS,
     "histogram_blocks(codes, shift, mask, rows, shift, mask, weights, shift, mask, edges, "
     "blocks, feat, uniq_off, uniq_all, missing, thr, y, out, S, mode): every evaluated "
     "block's entries' statistics added to their bins of out (mode + 2: each block's sums "
     "added to out's, a running total)."},
    {"grid_sums", grid_sums, METH_VARARGS,
     "grid_sums(node, row, weight, pos, feats, thr, uniq_off, uniq_all, codes, y, out, n_rows, "
     "m, S, mode, has_missing, missing_bin): every evaluated pair's statistics added to its "
     "bin of out (E, m, nb, S)."},
    {"marginal_at", marginal_at, METH_VARARGS,
     "marginal_at(xs, cdf, feats, values, out, L, mode): the secure sketch's prior CDF at "
     "values (mode 0) or its quantiles at levels (mode 1), per row's feature."},
    {"grid_picks", grid_picks, METH_VARARGS,
     "grid_picks(rows, counts, total, edges, bnu, pick, B, W): per row the grid edges nearest "
     "to b / bnu of the pooled CDF, sorted, W where none."},
    {"encode_values", encode_values, METH_VARARGS,
     "encode_values(values, divisor, factor, limit, out) -> -1 or the first index out of "
     "range: round(values / divisor * factor) into the ring."},
    {"pack_cells", pack_cells, METH_VARARGS,
     "pack_cells(entries, out, s_bits): each (count, sum) pair of entries as "
     "(count << s_bits) + sum modulo 2^64."},
    {"order_keys", order_keys, METH_VARARGS,
     "order_keys(node, row, weight, codes, fstart, unused, keys, m, shift, hi, packed) -> "
     "number of unused keys: a level order's keys, slot by slot."},
    {"sorted_keys", sorted_keys, METH_VARARGS,
     "sorted_keys(node, row, weight, codes, feats, keys, n_rows, m, shift, hi) -> number of "
     "keys: a packed level order's keys in ascending order, without sorting."},
    {"node_totals", node_totals, METH_VARARGS,
     "node_totals(node, row, weight, stats, out, S, weight_first): the row statistics summed "
     "per node over the pairs, in their order."},
    {"route_pairs", route_pairs, METH_VARARGS,
     "route_pairs(node, row, codes, fbase, cut, left, right, out): each pair's node in the "
     "next level through its node's numeric split (left where its code is below the cut)."},
    {"list_lengths", list_lengths, METH_VARARGS,
     "list_lengths(points, lengths, P) -> -1 or the first list with a point after its NaN "
     "padding: each list's points before its padding."},
    {"best_moments", best_moments, METH_VARARGS,
     "best_moments(hist, thr, valid, gain, slot, index, left, more_left, E, m, bt, min_leaf): "
     "per node the best numeric split of (n, sum y) histograms (E, m, bt + 1, 2)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ckernels", "Compiled loops of the engine's hot paths.", -1,
    methods, NULL, NULL, NULL, NULL,
};

#ifndef FEDFOREST_KERNELS_DIGEST
#define FEDFOREST_KERNELS_DIGEST ""  /* built without setup.py: sources unknown */
#endif

PyMODINIT_FUNC PyInit__ckernels(void)
{
    PyObject *m = PyModule_Create(&module);
    /* what the module was built from (setup.py's source_digest), checked at import */
    if (m != NULL && PyModule_AddStringConstant(m, "SOURCE_DIGEST", FEDFOREST_KERNELS_DIGEST)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
