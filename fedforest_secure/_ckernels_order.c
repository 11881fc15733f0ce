/* A worker's level order (fedforest_secure._order.LevelOrder): its keys (order_keys, and
 * sorted_keys for packed keys in order), and the quantile points of its blocks (sketch_values,
 * fedforest_secure._level_stats). */
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
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOOnnnn", &o[0], &o[1], &o[2], &o_codes, &o[3], &o[4],
                          &o[5], &m, &shift, &hi, &packed))
        return NULL;
    if (get_buffers(o, v, fmt, name, 6, 5, &got) != 0
        || get_i32(o_codes, &vc, "order_keys") != 0)
        goto done;
    gotc = 1;
    P = v[0].len / 8;
    nn = m > 0 ? (v[3].len / 8) / m : 0;
    nc = vc.len / 4;
    if (m < 1 || m > MAX_WIDTH || shift < 0
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

/* qsort's order of int64 values */
static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Sorts the c values of buf, each rank << 8 | weight (0 <= rank < n_rows), ascending: by
 * insertion when they are few; else by a bitmap over the ranks between their least and their
 * greatest when that span is not much longer than c and no rank repeats (bits: zero on entry,
 * zero on return; wr: a weight per rank); else by qsort. */
static void sort_block(int64_t *buf, int64_t c, uint64_t *bits, uint8_t *wr)
{
    int64_t i, j, lo, hi;
    int dup = 0;
    if (c <= 8) {
        for (i = 1; i < c; i++) {
            int64_t k = buf[i];
            for (j = i; j > 0 && buf[j - 1] > k; j--)
                buf[j] = buf[j - 1];
            buf[j] = k;
        }
        return;
    }
    lo = hi = buf[0] >> 8;
    for (i = 1; i < c; i++) {
        int64_t rk = buf[i] >> 8;
        lo = rk < lo ? rk : lo;
        hi = rk > hi ? rk : hi;
    }
    lo >>= 6;
    hi >>= 6;
    if (hi - lo + 1 <= 8 * c) {
        for (i = 0; i < c; i++) {
            int64_t rk = buf[i] >> 8;
            uint64_t bit = (uint64_t)1 << (rk & 63);
            dup |= (bits[rk >> 6] & bit) != 0;
            bits[rk >> 6] |= bit;
            wr[rk] = (uint8_t)(buf[i] & 255);
        }
        if (!dup) {
            for (i = lo, j = 0; i <= hi; i++) {
                uint64_t w = bits[i];
                if (!w)
                    continue;
                bits[i] = 0;
                while (w) {
                    int64_t rk = (i << 6) + __builtin_ctzll(w);
                    buf[j++] = (rk << 8) | wr[rk];
                    w &= w - 1;
                }
            }
            return;
        }
        memset(bits + lo, 0, (size_t)(hi - lo + 1) * sizeof(uint64_t));
    }
    qsort(buf, (size_t)c, sizeof(int64_t), cmp_i64);
}

/* The sorted keys of a packed level order (fedforest_secure._order.LevelOrder), built block
 * by block rather than sorted whole: keys gets, ascending, the key ((node * m + s) << hi |
 * code << shift | row << 8 | weight) of every pair p (node[p], row[p], weight[p] < 256) and
 * every slot s of its node whose feature f = feats[node, s] is not -1, code being
 * codes[f * n_rows + row] (int32, 0 <= code < 2^(hi - shift)). A block (node, slot) has its
 * run of the output (from the blocks' sizes); a feature's rows are ranked by (code, row) once,
 * and each of its blocks sorts its pairs' ranks (sort_block). Returns the number of keys
 * written (keys holds at least that many). */
PyObject *sorted_keys(PyObject *self, PyObject *args)
{
    PyObject *o[5], *o_codes;
    Py_buffer v[5], vc;
    Py_ssize_t n_rows, m, shift, hi, P, nn, nc, d, nk, total = 0;
    int got = 0, gotc = 0, bad = 0;
    static const char *fmt[5] = {"q", "q", "q", "q", "q"};
    static const char *name[5] = {"node", "row", "weight", "feats", "keys"};
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOnnnn", &o[0], &o[1], &o[2], &o_codes, &o[3], &o[4],
                          &n_rows, &m, &shift, &hi))
        return NULL;
    if (get_buffers(o, v, fmt, name, 5, 4, &got) != 0
        || get_i32(o_codes, &vc, "sorted_keys") != 0)
        goto done;
    gotc = 1;
    nc = vc.len / 4;
    d = n_rows > 0 ? nc / n_rows : 0;
    nk = v[4].len / 8;
    P = v[0].len / 8;
    nn = m > 0 ? (v[3].len / 8) / m : 0;
    if (m < 1 || m > MAX_WIDTH || n_rows < 1
        || n_rows >= ((Py_ssize_t)1 << 31) || nc != d * n_rows || shift < 8 || hi <= shift
        || hi > 62 || v[1].len != v[0].len || v[2].len != v[0].len
        || !bytes_eq(v[3].len, nn, m, 1) || P >= ((Py_ssize_t)1 << 40)) {
        PyErr_SetString(PyExc_ValueError, "sorted_keys: array sizes or types do not match");
        goto done;
    }
    /* every block's index fits above hi (no signed overflow), every row below shift */
    if ((nn * m > 0 && nn * m - 1 >= ((Py_ssize_t)1 << (63 - hi)))
        || n_rows > ((Py_ssize_t)1 << (shift - 8))) {
        PyErr_SetString(PyExc_ValueError, "sorted_keys: the block index or the row does not "
                        "fit its field of the key");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        const int64_t *node = v[0].buf, *row = v[1].buf, *wt = v[2].buf, *feats = v[3].buf;
        const int32_t *codes = vc.buf;
        int64_t *keys = v[4].buf, *nstart = NULL, *pos = NULL, *fstart = NULL, *blocks = NULL,
                *cnt = NULL, *lowk = NULL, *buf = NULL;
        int32_t *prow = NULL, *rank = NULL;
        uint64_t *bits = NULL;
        uint8_t *pw = NULL, *wr = NULL;
        int64_t ncode = 0, cmax = (int64_t)1 << (hi - shift), most = 0, i, p, f, b, nd;
        nstart = calloc((size_t)nn + 2, sizeof(int64_t));
        pos = malloc(((size_t)nn * m + 1) * sizeof(int64_t));
        fstart = calloc((size_t)d + 2, sizeof(int64_t));
        blocks = malloc(((size_t)nn * m + 1) * sizeof(int64_t));
        prow = malloc(((size_t)P + 1) * sizeof(int32_t));
        pw = malloc((size_t)P + 1);
        lowk = malloc((size_t)n_rows * sizeof(int64_t));
        rank = malloc((size_t)n_rows * sizeof(int32_t));
        bits = calloc(((size_t)n_rows >> 6) + 1, sizeof(uint64_t));
        wr = malloc((size_t)n_rows);
        if (!nstart || !pos || !fstart || !blocks || !prow || !pw || !lowk || !rank || !bits
            || !wr) {
            bad = 2;
            goto out;
        }
        for (i = 0; i < nc; i++) { /* the codes' range: a feature's count table */
            if (codes[i] < 0 || codes[i] >= cmax) {
                bad = 1;
                goto out;
            }
            if (codes[i] >= ncode)
                ncode = (int64_t)codes[i] + 1;
        }
        cnt = malloc(((size_t)ncode + 1) * sizeof(int64_t));
        if (!cnt) {
            bad = 2;
            goto out;
        }
        /* the pairs by node, in their order: nstart[nd] .. nstart[nd + 1] */
        for (p = 0; p < P; p++) {
            if (node[p] < 0 || node[p] >= nn || row[p] < 0 || row[p] >= n_rows || wt[p] < 0
                || wt[p] > 255) {
                bad = 1;
                goto out;
            }
            nstart[node[p] + 2]++;
        }
        for (nd = 0; nd < nn; nd++) {
            most = nstart[nd + 2] > most ? nstart[nd + 2] : most;
            nstart[nd + 2] += nstart[nd + 1];
        }
        for (p = 0; p < P; p++) { /* nstart[nd + 1] runs over node nd's pairs */
            int64_t at = nstart[node[p] + 1]++;
            prow[at] = (int32_t)row[p];
            pw[at] = (uint8_t)wt[p];
        }
        buf = malloc(((size_t)most + 1) * sizeof(int64_t));
        if (!buf) {
            bad = 2;
            goto out;
        }
        /* each block's run (a used slot holds one entry per pair of its node), and the
         * blocks of each feature (fstart[f + 1] .. fstart[f + 2], then fstart[f] ..) */
        for (b = 0; b < nn * m; b++) {
            f = feats[b];
            if (f < -1 || f >= d) {
                bad = 1;
                goto out;
            }
            pos[b] = total;
            if (f >= 0) {
                total += nstart[b / m + 1] - nstart[b / m];
                fstart[f + 2]++;
            }
        }
        if (total > nk) {
            bad = 1;
            goto out;
        }
        for (f = 0; f < d; f++)
            fstart[f + 2] += fstart[f + 1];
        for (b = 0; b < nn * m; b++)
            if (feats[b] >= 0)
                blocks[fstart[feats[b] + 1]++] = b;
        for (f = 0; f < d; f++) {
            const int32_t *fc = codes + f * n_rows;
            if (fstart[f + 1] == fstart[f])
                continue;
            /* the feature's rows ranked by (code, row); lowk: code and row fields by rank */
            memset(cnt, 0, ((size_t)ncode + 1) * sizeof(int64_t));
            for (i = 0; i < n_rows; i++)
                cnt[fc[i] + 1]++;
            for (i = 0; i < ncode; i++)
                cnt[i + 1] += cnt[i];
            for (i = 0; i < n_rows; i++) {
                int64_t rk = cnt[fc[i]]++;
                rank[i] = (int32_t)rk;
                lowk[rk] = ((int64_t)fc[i] << shift) | (i << 8);
            }
            for (i = fstart[f]; i < fstart[f + 1]; i++) {
                int64_t bb = blocks[i], s0 = nstart[bb / m], c = nstart[bb / m + 1] - s0, j;
                int64_t *kout = keys + pos[bb], blk = bb << hi;
                for (j = 0; j < c; j++)
                    buf[j] = ((int64_t)rank[prow[s0 + j]] << 8) | pw[s0 + j];
                sort_block(buf, c, bits, wr);
                for (j = 0; j < c; j++)
                    kout[j] = blk | lowk[buf[j] >> 8] | (buf[j] & 255);
            }
        }
    out:
        free(nstart);
        free(pos);
        free(fstart);
        free(blocks);
        free(cnt);
        free(prow);
        free(pw);
        free(lowk);
        free(rank);
        free(bits);
        free(wr);
        free(buf);
    }
    Py_END_ALLOW_THREADS
    if (bad == 2)
        PyErr_NoMemory();
    else if (bad)
        PyErr_SetString(PyExc_ValueError, "sorted_keys: a pair's node, row or weight, a "
                        "feature or a code is out of range, or the keys do not fit");
done:
    if (gotc)
        PyBuffer_Release(&vc);
    return finish(v, got, bad ? NULL : PyLong_FromSsize_t(total));
}
