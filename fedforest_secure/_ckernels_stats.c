/* A worker's histograms (histogram_blocks, grid_sums), the secure sketch's prior and picks
 * (marginal_at, grid_picks) and secure aggregation's fixed-point encoding (encode_values). */
#include "_ckernels.h"

/* The entries e0 .. e1 of one block of histogram_blocks: vals are the feature's values (a
 * code indexes them; nv of them), miss its missing code (-1: none), t its W thresholds, out
 * its (W + 1, S) sums. Returns 1 on an entry out of range. */
static inline __attribute__((always_inline)) int
hist_entries(const field *fl, int cs, int rs, int ws, int64_t e0, int64_t e1, int64_t miss,
             const double *vals, int64_t nv, const double *t, int64_t W, double *out,
             int64_t S, int64_t mode, const double *y, int64_t ny)
{
    int64_t i, bin = 0;
    for (i = e0; i < e1; i++) {
        int64_t code = fgetk(&fl[0], i, cs);
        double wi;
        if (miss >= 0 && code >= miss) {
            bin = W; /* past every threshold: the missing rows' own bin */
        } else {
            if (code < 0 || code >= nv)
                return 1;
            /* codes ascend within a block, so bins do: walk on from the last one */
            while (bin < W && t[bin] < vals[code])
                bin++;
        }
        wi = (double)fgetk(&fl[2], i, ws);
        if (mode == 0) {
            double *cell = out + bin * S;
            cell[0] += wi;
            if (S > 1) {
                int64_t r = fgetk(&fl[1], i, rs);
                double wy;
                if (r < 0 || r >= ny)
                    return 1;
                wy = wi * y[r];
                cell[1] += wy;
                if (S > 2)
                    cell[2] += wy * y[r];
            }
        } else {
            int64_t r = fgetk(&fl[1], i, rs);
            if (r < 0 || r >= ny || !(y[r] >= 0 && y[r] < (double)S)) /* NaN fails too */
                return 1;
            out[bin * S + (int64_t)y[r]] += wi;
        }
    }
    return 0;
}

/* The worker's histogram (fedforest_secure._level_stats.LevelStatistics._histogram): every
 * entry of an evaluated block (blocks[q], its entries edges[b] .. edges[b + 1] of the level's
 * sorted order) goes to bin "number of the block's thresholds thr[q] below its value" (the
 * last bin, W, for a missing value), and each bin sums its entries' statistics one after the
 * other in the order's sequence, as numpy's bincount: mode 0 the weight, then weight * y and
 * weight * y * y (S of them); mode 1 the weight into column y (a class code) of S.
 *
 * The entries' code, row and weight are fields (see field); feat[b] is the block's feature, a
 * value is uniq_all[uniq_off[f] + code], missing[f] the missing code (an empty array: no
 * missing values); out (len(blocks), W + 1, S) is added to. With mode + 2 (a running total
 * of other clients' sums in out) each block's bins are summed from 0.0 apart and then added
 * to out's, as numpy adds this client's histogram to the total: every evaluated block's
 * W + 1 bins, an empty block's zeros too. */
PyObject *histogram_blocks(PyObject *self, PyObject *args)
{
    PyObject *of[3], *o[9];
    Py_buffer vf[3], v[9];
    Py_ssize_t sh[3], S, mode, n_eval, nblk, W, nf, ny, nu, q;
    unsigned long long mk[3];
    field fl[3];
    int k, gotf = 0, got = 0, bad = 0;
    static const char *fmt[9] = {"q", "q", "q", "q", "d", "q", "d", "d", "d"};
    static const char *name[9] = {"edges", "blocks", "feat", "uniq_off", "uniq_all", "missing",
                                  "thr", "y", "out"};
    static const char *fname[3] = {"codes", "rows", "weights"};
    (void)self;
    if (!PyArg_ParseTuple(args, "OnKOnKOnKOOOOOOOOOnn", &of[0], &sh[0], &mk[0], &of[1], &sh[1],
                          &mk[1], &of[2], &sh[2], &mk[2], &o[0], &o[1], &o[2], &o[3], &o[4],
                          &o[5], &o[6], &o[7], &o[8], &S, &mode))
        return NULL;
    for (k = 0; k < 3; k++, gotf++)
        if (get_field(of[k], &vf[k], sh[k], mk[k], &fl[k], fname[k]) != 0)
            goto done;
    if (get_buffers(o, v, fmt, name, 9, 8, &got) != 0)
        goto done;
    nblk = v[2].len / 8;
    n_eval = v[1].len / 8;
    nf = v[3].len / 8 - 1; /* uniq_off: one offset per feature and the end */
    nu = v[4].len / 8;
    ny = v[7].len / 8;
    W = n_eval > 0 ? (v[6].len / 8) / n_eval : 0;
    if (S < 1 || S > MAX_WIDTH || mode < 0 || mode > 3 || !bytes_eq(v[0].len, nblk + 1, 1, 1)
        || nf < 0 || (v[5].len != 0 && !bytes_eq(v[5].len, nf, 1, 1))
        || !bytes_eq(v[6].len, n_eval, W, 1) || !bytes_eq(v[8].len, n_eval, W + 1, S)
        || fl[1].n != fl[0].n || fl[2].n != fl[0].n) {
        PyErr_SetString(PyExc_ValueError, "histogram_blocks: array sizes do not match");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        const int64_t *edges = v[0].buf, *blocks = v[1].buf, *feat = v[2].buf,
                      *uoff = v[3].buf, *miss = v[5].len ? v[5].buf : NULL;
        const double *uall = v[4].buf, *thr = v[6].buf, *y = v[7].buf;
        double *out = v[8].buf;
        const int lay = layout_of(&fl[0], &fl[1], &fl[2]);
        const int64_t add = mode >= 2, cells = (W + 1) * S;
        /* with add: one block's sums, then added to out's (the running total) */
        double *sums = add ? malloc((size_t)cells * sizeof(double)) : NULL;
        mode &= 1;
        if (add && sums == NULL)
            bad = 2;
        for (q = 0; q < n_eval && !bad; q++) {
            int64_t b = blocks[q], f, e0, e1, j;
            const double *t = thr + q * W;
            double *o = add ? sums : out + q * cells;
            if (b < 0 || b >= nblk) {
                bad = 1;
                break;
            }
            f = feat[b];
            e0 = edges[b];
            e1 = edges[b + 1];
            if (add)
                for (j = 0; j < cells; j++)
                    sums[j] = 0.0;
            if (e0 < e1) {
                if (f < 0 || f >= nf || e0 < 0 || e1 > fl[0].n || uoff[f] < 0
                    || uoff[f] > nu) {
                    bad = 1;
                    break;
                }
                if (lay == 8)
                    bad = hist_entries(fl, 8, 8, 8, e0, e1, miss ? miss[f] : -1,
                                       uall + uoff[f], nu - uoff[f], t, W, o, S, mode, y, ny);
                else if (lay == 2)
                    bad = hist_entries(fl, 2, 2, 1, e0, e1, miss ? miss[f] : -1,
                                       uall + uoff[f], nu - uoff[f], t, W, o, S, mode, y, ny);
                else
                    bad = hist_entries(fl, 0, 0, 0, e0, e1, miss ? miss[f] : -1,
                                       uall + uoff[f], nu - uoff[f], t, W, o, S, mode, y, ny);
            }
            if (add && !bad) {
                double *to = out + q * cells;
                for (j = 0; j < cells; j++)
                    to[j] += sums[j];
            }
        }
        free(sums);
    }
    Py_END_ALLOW_THREADS
    if (bad == 2) {
        PyErr_NoMemory();
        goto done;
    }
    if (bad)
        PyErr_SetString(PyExc_ValueError,
                        "histogram_blocks: an entry's block, value, row or class is out of range");
done:
    for (k = 0; k < gotf; k++)
        PyBuffer_Release(&vf[k]);
    return finish(v, got, Py_NewRef(Py_None));
}

/* A worker's histogram without a sorted order (fedforest_secure._grid_stats.bin_statistics):
 * pair by pair, every pair (node, row, weight) of an evaluated node (pos[node] >= 0), in
 * each of its node's slots that has a feature, finds its bin, the number of its (node,
 * slot)'s sorted thresholds below its value, by a binary search, and adds its statistics to
 * it; each bin adds its pairs in the pairs' order, as numpy's bincount per slot does.
 * Mode 0 adds the weight, weight * y, weight * y * y (S of them); mode 1 the weight into
 * column y (a class code). A missing value (code past the feature's distinct values, with
 * has_missing) goes to bin W + 1 with missing_bin, else nowhere. out (E, m, nb, S) is added
 * to, nb = W + 1 + missing_bin. */
PyObject *grid_sums(PyObject *self, PyObject *args)
{
    PyObject *o[11];
    Py_buffer v[11];
    Py_ssize_t n_rows, m, S, mode, has_missing, missing_bin, P, E, W, nb, nf, nu, nc, nn, s;
    int got = 0, bad = 0;
    static const char *fmt[11] = {"q", "q", "q", "q", "q", "d", "q", "d", "q", "d", "d"};
    static const char *name[11] = {"node", "row", "weight", "pos", "feats", "thr", "uniq_off",
                                   "uniq_all", "codes", "y", "out"};
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOnnnnnn", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &o[6], &o[7], &o[8], &o[9], &o[10], &n_rows, &m, &S, &mode,
                          &has_missing, &missing_bin))
        return NULL;
    if (get_buffers(o, v, fmt, name, 11, 10, &got) != 0)
        goto done;
    P = v[0].len / 8;
    nn = v[3].len / 8;
    E = m > 0 ? (v[4].len / 8) / m : 0;
    W = E > 0 ? (v[5].len / 8) / (E * m) : 0;
    nb = W + 1 + (missing_bin != 0);
    nf = v[6].len / 8 - 1;
    nu = v[7].len / 8;
    nc = v[8].len / 8;
    if (m < 1 || m > MAX_WIDTH || S < 1 || S > MAX_WIDTH || (mode != 0 && mode != 1)
        || n_rows < 0 || v[1].len != v[0].len || v[2].len != v[0].len
        || !bytes_eq(v[4].len, E, m, 1) || !bytes_eq(v[5].len, E * m, W, 1)
        || !bytes_eq(v[10].len, E * m, nb, S) || nf < 0
        || !bytes_at_least(v[8].len, nf, n_rows)) {
        PyErr_SetString(PyExc_ValueError, "grid_sums: array sizes do not match");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        const int64_t *node = v[0].buf, *row = v[1].buf, *wt = v[2].buf, *pos = v[3].buf,
                      *feats = v[4].buf, *uoff = v[6].buf, *codes = v[8].buf;
        const double *thr = v[5].buf, *uall = v[7].buf, *y = v[9].buf;
        double *o2 = v[10].buf;
        const Py_ssize_t ny = v[9].len / 8;
        Py_ssize_t i;
        /* pair by pair, each pair's slots: a cell (one slot's) adds its pairs in their order */
        for (i = 0; i < P && !bad; i++) {
            int64_t nd = node[i], e;
            if (nd < 0 || nd >= nn) {
                bad = 1;
                break;
            }
            e = pos[nd];
            if (e < 0)
                continue;
            if (e >= E) {
                bad = 1;
                break;
            }
            for (s = 0; s < m; s++) {
                int64_t f, r, at, code, bin;
                double x, wi;
                const double *t;
                double *cell;
                f = feats[e * m + s];
                if (f < 0)
                    continue;
                r = row[i];
                if (f >= nf || r < 0 || r >= n_rows || f * n_rows + r >= nc || r >= ny) {
                    bad = 1;
                    break;
                }
                code = codes[f * n_rows + r];
                if (has_missing && code >= uoff[f + 1] - uoff[f]) {
                    if (!missing_bin)
                        continue;
                    bin = W + 1;
                } else {
                    if (code < 0 || code >= nu || uoff[f] < 0 || uoff[f] >= nu
                        || (at = uoff[f] + code) >= nu) {
                        bad = 1;
                        break;
                    }
                    x = uall[at];
                    t = thr + (e * m + s) * W;
                    /* the number of thresholds below x, by a branch-free binary search */
                    bin = 0;
                    if (W > 0) {
                        const double *b = t;
                        int64_t len = W;
                        while (len > 1) {
                            int64_t half = len >> 1;
                            b = b[half] < x ? b + half : b;
                            len -= half;
                        }
                        bin = (b - t) + (*b < x);
                    }
                }
                wi = (double)wt[i];
                cell = o2 + ((e * m + s) * nb + bin) * S;
                if (mode == 0) {
                    cell[0] += wi;
                    if (S > 1) {
                        double wy = wi * y[r];
                        cell[1] += wy;
                        if (S > 2)
                            cell[2] += wy * y[r];
                    }
                } else {
                    int64_t c;
                    if (!(y[r] >= 0 && y[r] < (double)S)) { /* NaN fails too */
                        bad = 1;
                        break;
                    }
                    c = (int64_t)y[r];
                    cell[c] += wi;
                }
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (bad)
        PyErr_SetString(PyExc_ValueError,
                        "grid_sums: a pair's node, row, value or class is out of range");
done:
    return finish(v, got, Py_NewRef(Py_None));
}

/* count of a[0..L) (non-decreasing) below v (strict) or at most v */
static inline int64_t count_sorted(const double *a, int64_t L, double v, int strict)
{
    int64_t lo = 0, hi = L;
    while (lo < hi) {
        int64_t mid = (lo + hi) >> 1;
        if (strict ? a[mid] < v : a[mid] <= v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The secure sketch's prior (fedforest_secure._secure_cdf.Marginal): per feature a
 * piecewise-linear CDF through (xs[f, i], cdf[f, i]) (F, L), sorted and padded with +inf / 1.
 * mode 0 (cdf_at): the CDF of feature feats[n] at each of the J values vals[n, :]; mode 1
 * (quantile_at): the first x where it reaches each of them. out (N, J). */
PyObject *marginal_at(PyObject *self, PyObject *args)
{
    PyObject *o[5];
    Py_buffer v[5];
    Py_ssize_t L, mode, N, J, F, i, j;
    int got = 0, bad = 0;
    static const char *fmt[5] = {"d", "d", "q", "d", "d"};
    static const char *name[5] = {"xs", "cdf", "feats", "values", "out"};
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOnn", &o[0], &o[1], &o[2], &o[3], &o[4], &L, &mode))
        return NULL;
    if (get_buffers(o, v, fmt, name, 5, 4, &got) != 0)
        goto done;
    N = v[2].len / 8;
    F = L > 0 ? (v[0].len / 8) / L : 0;
    J = N > 0 ? (v[3].len / 8) / N : 0;
    if (L < 1 || (mode != 0 && mode != 1) || !bytes_eq(v[0].len, F, L, 1)
        || v[1].len != v[0].len || !bytes_eq(v[3].len, N, J, 1) || v[4].len != v[3].len) {
        PyErr_SetString(PyExc_ValueError, "marginal_at: array sizes do not match");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        const double *xs = v[0].buf, *cdf = v[1].buf, *val = v[3].buf;
        const int64_t *feats = v[2].buf;
        double *out = v[4].buf;
        for (i = 0; i < N && !bad; i++) {
            int64_t f = feats[i];
            const double *xr, *cr;
            if (f < 0 || f >= F) {
                bad = 1;
                break;
            }
            xr = xs + f * L;
            cr = cdf + f * L;
            for (j = 0; j < J; j++) {
                double x = val[i * J + j], x0, x1, c0, c1, t, r;
                int64_t kk = count_sorted(mode ? cr : xr, L, x, mode == 1);
                int64_t i1 = kk < L - 1 ? kk : L - 1, i0 = kk - 1 > 0 ? kk - 1 : 0;
                x0 = xr[i0];
                x1 = xr[i1];
                c0 = cr[i0];
                c1 = cr[i1];
                if (mode == 0) {
                    double span = (isfinite(x1) && x1 > x0) ? x1 - x0 : 1.0;
                    t = clip((x - x0) / span, 0.0, 1.0);
                    r = kk == 0 ? 0.0
                                : ((isfinite(x1) && kk < L) ? c0 + t * (c1 - c0) : c0);
                } else {
                    double step = c1 > c0 ? c1 - c0 : 1.0;
                    t = clip((x - c0) / step, 0.0, 1.0);
                    r = kk == 0 ? x1 : x0 + t * (isfinite(x1) ? x1 - x0 : 0.0);
                }
                out[i * J + j] = r;
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (bad)
        PyErr_SetString(PyExc_ValueError, "marginal_at: a feature is out of range");
done:
    return finish(v, got, Py_NewRef(Py_None));
}

/* int64 insertion sort (short rows) */
static void sort_i64(int64_t *t, int64_t n)
{
    int64_t i, j;
    for (i = 1; i < n; i++) {
        int64_t v = t[i];
        for (j = i; j > 0 && v < t[j - 1]; j--)
            t[j] = t[j - 1];
        t[j] = v;
    }
}

/* The secure sketch's candidates (fedforest_secure._cdf_grids.grid_picks): for
 * each row q (grid row rows[q]) with cells' counts (W + 1 per row), their total and the grid's
 * edges (W per row, +inf padded), for b = 1 .. B - 1 below bnu the edge whose pooled CDF
 * (cumulative count / total; 3.0 at padding) is nearest to b / bnu (the lower one on a tie),
 * found as numpy's searchsorted over the rows laid end to end at offsets 4 q; sorted, repeats
 * and b >= bnu given W. pick (len(rows), B - 1). */
PyObject *grid_picks(PyObject *self, PyObject *args)
{
    PyObject *o[6];
    Py_buffer v[6];
    Py_ssize_t B, W, Q, R, q;
    int got = 0, bad = 0;
    static const char *fmt[6] = {"q", "d", "d", "d", "q", "q"};
    static const char *name[6] = {"rows", "counts", "total", "edges", "bnu", "pick"};
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOnn", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &B, &W))
        return NULL;
    if (get_buffers(o, v, fmt, name, 6, 5, &got) != 0)
        goto done;
    Q = v[0].len / 8;
    R = v[2].len / 8;
    if (B < 2 || B > MAX_WIDTH || W < 1 || !bytes_eq(v[1].len, R, W + 1, 1)
        || !bytes_eq(v[3].len, R, W, 1) || !bytes_eq(v[4].len, R, 1, 1)
        || !bytes_eq(v[5].len, Q, B - 1, 1) || (Q > 0 && R < 1)) {
        PyErr_SetString(PyExc_ValueError, "grid_picks: array sizes do not match");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        const int64_t *rows = v[0].buf, *bnu = v[4].buf;
        const double *counts = v[1].buf, *total = v[2].buf, *edges = v[3].buf;
        int64_t *pick = v[5].buf;
        double *cum = malloc((size_t)W * sizeof(double));
        if (cum == NULL)
            bad = 2;
        for (q = 0; q < Q && !bad; q++) {
            int64_t r = rows[q], b, j, i = 0, *pk = pick + q * (B - 1);
            double acc = 0.0, off = 4.0 * (double)q;
            if (r < 0 || r >= R || bnu[r] < 1) {
                bad = 1;
                break;
            }
            for (j = 0; j < W; j++) { /* cumulative counts through cell j, over the total */
                acc = j == 0 ? counts[r * (W + 1)] : acc + counts[r * (W + 1) + j];
                cum[j] = isfinite(edges[r * W + j]) ? acc / total[r] : 3.0;
            }
            for (b = 1; b < B; b++) {
                double u = (double)b / (double)bnu[r], key = u + off, d_hi, d_lo;
                int64_t hi_i, lo_i;
                if (b >= bnu[r]) {
                    pk[b - 1] = W;
                    continue;
                }
                while (i < W && cum[i] + off < key) /* the levels ascend: walk on */
                    i++;
                hi_i = i < W - 1 ? i : W - 1;
                lo_i = i - 1 > 0 ? (i - 1 < W - 1 ? i - 1 : W - 1) : 0;
                d_hi = fabs(cum[hi_i] - u);
                d_lo = fabs(cum[lo_i] - u);
                pk[b - 1] = d_lo <= d_hi ? lo_i : hi_i;
            }
            sort_i64(pk, B - 1);
            for (b = B - 2; b >= 1; b--)
                if (pk[b] == pk[b - 1])
                    pk[b] = W;
            sort_i64(pk, B - 1);
        }
        free(cum);
    }
    Py_END_ALLOW_THREADS
    if (bad == 2)
        PyErr_NoMemory();
    else if (bad)
        PyErr_SetString(PyExc_ValueError, "grid_picks: a row is out of range");
done:
    return finish(v, got, Py_NewRef(Py_None));
}

/* Fixed-point encoding into the ring Z_{2^64} (fedforest_secure.secagg._primitives._ring.
 * encode_block): x = values[j] / divisor[j] (no division where divisor is empty), checked
 * |x| <= limit[j] (no check where limit is empty; NaN fails), then out[j] = round-half-even(
 * x * factor[j]) as a two's complement int64 in uint64. A divisor, factor or limit of one
 * entry holds for every j. Returns -1, or the first index out of range (out is then partly
 * written). */
PyObject *encode_values(PyObject *self, PyObject *args)
{
    PyObject *o[5];
    Py_buffer v[5];
    Py_ssize_t n, nd, nf, nl, j, bad = -1;
    int got = 0;
    static const char *fmt[5] = {"d", "d", "d", "d", "Q"};
    static const char *name[5] = {"values", "divisor", "factor", "limit", "out"};
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOO", &o[0], &o[1], &o[2], &o[3], &o[4]))
        return NULL;
    if (get_buffers(o, v, fmt, name, 5, 4, &got) != 0)
        goto done;
    n = v[0].len / 8;
    nd = v[1].len / 8;
    nf = v[2].len / 8;
    nl = v[3].len / 8;
    if (v[4].len != n * 8 || (nd != 0 && nd != 1 && nd != n) || (nf != 1 && nf != n)
        || (nl != 0 && nl != 1 && nl != n)) {
        PyErr_SetString(PyExc_ValueError, "encode_values: array sizes do not match");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        const double *val = v[0].buf, *dv = v[1].buf, *fc = v[2].buf, *lm = v[3].buf;
        const double magic = 0x1.8p52;
        int64_t *out = v[4].buf, magic_bits;
        memcpy(&magic_bits, &magic, 8);
        for (j = 0; j < n; j++) {
            double x = val[j];
            if (nd)
                x = x / dv[nd == 1 ? 0 : j];
            if (nl && !(fabs(x) <= lm[nl == 1 ? 0 : j])) {
                bad = j;
                break;
            }
            x *= fc[nf == 1 ? 0 : j];
            if (fabs(x) < 0x1p50) { /* 1.5 * 2^52 added: the integer in the low mantissa bits */
                double t = x + 0x1.8p52;
                int64_t bits;
                memcpy(&bits, &t, 8);
                out[j] = bits - magic_bits;
            } else if (fabs(x) < 0x1p63) {
                out[j] = (int64_t)nearbyint(x);
            } else { /* NaN, infinite or beyond int64 (unchecked): numpy's cast gives INT64_MIN */
                out[j] = INT64_MIN;
            }
        }
    }
    Py_END_ALLOW_THREADS
done:
    return finish(v, got, PyLong_FromSsize_t(bad));
}
