/* A worker's level order (fedforest_secure._order.LevelOrder): its keys (order_keys) and the
 * quantile points of its blocks (sketch_values, fedforest_secure._level_stats). */
#include "_ckernels.h"

/* One block s0 .. e0 of sketch_values (fields: weights, codes of item sizes ws, cs): its
 * points into o2, NaN after them up to o2[n_points]. vals are the feature's values (nv of
 * them), miss its missing code (-1: none). Returns 1 on a code out of range or weights that
 * overflow. */
static inline __attribute__((always_inline)) int
sketch_block(const field *fl, int ws, int cs, int64_t s0, int64_t e0, int64_t miss,
             const double *vals, int64_t nv, double *o2, int64_t n_points, int64_t r)
{
    int64_t j, b, bk, total = 0, cum, pos, q, rm, carry, base, last;
    if (miss >= 0) /* missing codes sort last in a block: the sketch ignores them */
        while (e0 > s0 && fgetk(&fl[1], e0 - 1, cs) >= miss)
            e0--;
    bk = 0; /* no point */
    if (e0 <= s0)
        goto pad;
    for (j = s0; j < e0; j++)
        if (__builtin_add_overflow(total, fgetk(&fl[0], j, ws), &total) || total < 0)
            return 1;
    bk = n_points;
    if (r >= 1) { /* r >= 2: distinct rows (the block's entries, whatever their weights) */
        bk = (r >= 2 ? e0 - s0 : total) / r;
        if (bk > n_points)
            bk = n_points;
        if (bk < 1) {
            bk = 0;
            goto pad;
        }
    }
    /* point b's target is max((b * total + bk - 1) / bk, 1) (integer division); b * total
     * grows with b, so it overflows for some b iff it does for b = bk. Without a division per
     * point: total = q * bk + rm, and (b * total + bk - 1) / bk = b * q + carry, where carry
     * is the quotient of b * rm + bk - 1 (rm < bk: it grows by at most one per point) */
    if (__builtin_mul_overflow(bk, total, &last) || __builtin_add_overflow(last, bk - 1, &last))
        return 1;
    q = total / bk;
    rm = total % bk;
    carry = 0;
    last = bk - 1; /* the remainder of b * rm + bk - 1 */
    base = 0;      /* b * q */
    pos = s0;
    cum = fgetk(&fl[0], s0, ws);
    for (b = 0; b <= bk; b++) {
        int64_t target = base + carry, code;
        if (target < 1)
            target = 1;
        while (cum < target && pos + 1 < e0)
            cum += fgetk(&fl[0], ++pos, ws);
        code = fgetk(&fl[1], pos, cs);
        if (code < 0 || code >= nv)
            return 1;
        o2[b] = vals[code];
        base += q;
        last += rm;
        if (last >= bk) {
            last -= bk;
            carry++;
        }
    }
    bk++; /* the points written */
pad:
    for (b = bk; b <= n_points; b++) /* NaN: no point (the blocks' lists' padding) */
        o2[b] = NAN;
    return 0;
}

/* The worker's quantile sketch (fedforest_secure._level_stats.LevelStatistics.quantile_points):
 * for every block i of the level's sorted order (entries edges[i] .. edges[i + 1], positive
 * integer weights and codes read from fields, see field) where wanted[i], its B_k + 1
 * quantile points Q(b / B_k), b = 0..B_k: the value of the first entry whose cumulative
 * weight within the block reaches max(ceil(b W / B_k), 1) (W the block's weight), at most the
 * block's last entry. Missing values (code >= missing[f], the block's last entries) are left
 * out. B_k is n_points, or min(C // r, n_points) with r >= 1 (adaptive B; no point where that
 * is 0): C is the block's entries left (its distinct rows) with r >= 2, W with r = 1. A value is uniq_all[uniq_off[f] + code], f = feat[i]; out (n_blocks, n_points + 1)
 * gets them, NaN in its other slots. */
PyObject *sketch_values(PyObject *self, PyObject *args)
{
    PyObject *of[2], *o[7];
    Py_buffer vf[2], v[7];
    Py_ssize_t sh[2], n_points, r, nblk, nf, nu, i;
    unsigned long long mk[2];
    field fl[2];
    int k, gotf = 0, got = 0, bad = 0;
    static const char *fmt[7] = {"q", "q", "q", "q", "d", "q", "d"};
    static const char *name[7] = {"edges", "wanted", "feat", "uniq_off", "uniq_all", "missing",
                                  "out"};
    static const char *fname[2] = {"weights", "codes"};
    (void)self;
    if (!PyArg_ParseTuple(args, "OnKOnKOOOOOOOnn", &of[0], &sh[0], &mk[0], &of[1], &sh[1],
                          &mk[1], &o[0], &o[1], &o[2], &o[3], &o[4], &o[5], &o[6], &n_points,
                          &r))
        return NULL;
    for (k = 0; k < 2; k++, gotf++)
        if (get_field(of[k], &vf[k], sh[k], mk[k], &fl[k], fname[k]) != 0)
            goto done;
    if (get_buffers(o, v, fmt, name, 7, 6, &got) != 0)
        goto done;
    nblk = v[1].len / 8;
    nf = v[3].len / 8 - 1;
    nu = v[4].len / 8;
    if (n_points < 1 || n_points > MAX_WIDTH || !bytes_eq(v[0].len, nblk + 1, 1, 1)
        || v[2].len != v[1].len || nf < 0 || (v[5].len != 0 && !bytes_eq(v[5].len, nf, 1, 1))
        || !bytes_eq(v[6].len, nblk, n_points + 1, 1) || fl[1].n != fl[0].n) {
        PyErr_SetString(PyExc_ValueError, "sketch_values: array sizes do not match");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        const int64_t *edges = v[0].buf, *wanted = v[1].buf, *feat = v[2].buf,
                      *uoff = v[3].buf, *miss = v[5].len ? v[5].buf : NULL;
        const double *uall = v[4].buf;
        double *out = v[6].buf;
        /* fields: weights, codes; the layouts of layout_of (its rows: the codes) */
        const int lay = layout_of(&fl[1], &fl[1], &fl[0]);
        for (i = 0; i < nblk && !bad; i++) {
            int64_t s0 = edges[i], e0 = edges[i + 1], f = feat[i], b;
            double *o2 = out + i * (n_points + 1);
            if (!wanted[i] || e0 <= s0) {
                for (b = 0; b <= n_points; b++) /* NaN: no point (the lists' padding) */
                    o2[b] = NAN;
                continue;
            }
            if (s0 < 0 || e0 > fl[0].n || f < 0 || f >= nf || uoff[f] < 0 || uoff[f] > nu) {
                bad = 1;
                break;
            }
            if (lay == 8)
                bad = sketch_block(fl, 8, 8, s0, e0, miss ? miss[f] : -1, uall + uoff[f],
                                   nu - uoff[f], o2, n_points, r);
            else if (lay == 2)
                bad = sketch_block(fl, 1, 2, s0, e0, miss ? miss[f] : -1, uall + uoff[f],
                                   nu - uoff[f], o2, n_points, r);
            else
                bad = sketch_block(fl, 0, 0, s0, e0, miss ? miss[f] : -1, uall + uoff[f],
                                   nu - uoff[f], o2, n_points, r);
        }
    }
    Py_END_ALLOW_THREADS
    if (bad)
        PyErr_SetString(PyExc_ValueError, "sketch_values: a block, code or weight is out of "
                        "range, or the weights overflow");
done:
    for (k = 0; k < gotf; k++)
        PyBuffer_Release(&vf[k]);
    return finish(v, got, Py_NewRef(Py_None));
}

/* The keys of a level order (fedforest_secure._order.LevelOrder): for slot s and pair p
 * (node[p], row[p], weight[p]), keys[s, p] = (codes[fstart[node, s] + row] << shift | base) +
 * (s << hi), base = (node * m) << hi | row << 8 | weight when packed, else (node * m) << hi;
 * INT64_MAX (sorts last) where the node's slot is unused (unused[node, s]). codes are int32.
 * Returns the number of unused keys. */
PyObject *order_keys(PyObject *self, PyObject *args)
{
    PyObject *o[6], *o_codes;
    Py_buffer v[6], vc;
    Py_ssize_t m, shift, hi, packed, P, nn, nc, s, p, n_unused = 0;
    int got = 0, gotc = 0, bad = 0;
    static const char *fmt[6] = {"q", "q", "q", "q", "q", "q"};
    static const char *name[6] = {"node", "row", "weight", "fstart", "unused", "keys"};
    const char *cf;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOOnnnn", &o[0], &o[1], &o[2], &o_codes, &o[3], &o[4],
                          &o[5], &m, &shift, &hi, &packed))
        return NULL;
    if (get_buffers(o, v, fmt, name, 6, 5, &got) != 0)
        goto done;
    cf = native_format(o_codes, &vc);
    if (cf == NULL)
        goto done;
    gotc = 1;
    P = v[0].len / 8;
    nn = m > 0 ? (v[3].len / 8) / m : 0;
    nc = vc.len / 4;
    if (vc.itemsize != 4 || strcmp(cf, "i") != 0 || m < 1 || m > MAX_WIDTH || shift < 0
        || shift > 62 || hi < 0 || hi > 62 || v[1].len != v[0].len || v[2].len != v[0].len
        || !bytes_eq(v[3].len, nn, m, 1) || v[4].len != v[3].len
        || !bytes_eq(v[5].len, m, P, 1)) {
        PyErr_SetString(PyExc_ValueError, "order_keys: array sizes or types do not match");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        const int64_t *node = v[0].buf, *row = v[1].buf, *wt = v[2].buf, *fstart = v[3].buf,
                      *unused = v[4].buf;
        const int32_t *codes = vc.buf;
        int64_t *keys = v[5].buf;
        for (s = 0; s < m && !bad; s++) {
            int64_t *out = keys + s * P, slot = (int64_t)((uint64_t)s << hi);
            for (p = 0; p < P; p++) {
                int64_t nd = node[p], at, base;
                if (nd < 0 || nd >= nn) {
                    bad = 1;
                    break;
                }
                if (unused[nd * m + s]) {
                    out[p] = INT64_MAX;
                    n_unused++;
                    continue;
                }
                at = fstart[nd * m + s] + row[p];
                if (at < 0 || at >= nc) {
                    bad = 1;
                    break;
                }
                /* in uint64: the bits of numpy's int64 shifts, ors and adds (wrapping) */
                base = (int64_t)((uint64_t)(nd * m) << hi);
                if (packed)
                    base |= (int64_t)((uint64_t)row[p] << 8) | wt[p];
                out[p] = (int64_t)((((uint64_t)(int64_t)codes[at] << shift) | (uint64_t)base)
                                   + (uint64_t)slot);
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (bad)
        PyErr_SetString(PyExc_ValueError, "order_keys: a pair's node or row is out of range");
done:
    if (gotc)
        PyBuffer_Release(&vc);
    return finish(v, got, PyLong_FromSsize_t(n_unused));
}
