/* The quantile sketches: the coordinator's pooled-CDF candidates (pooled_rows, list_lengths)
 * and a worker's level-order keys and quantile points (order_keys, sketch_values).
 *
 * pooled_rows computes, row by row, what fedforest_secure._sketch._pooled computes with numpy
 * for rows whose clients' mixing weights sum to 1: the pooled sketch CDF tabulated at every
 * reported point (_sketch._events), inverted at b / B (b = 1..B-1), cuts at a flat stretch
 * moved to the middle of the gap (_sketch._mid_gap), then sorted with duplicates replaced by
 * +inf. */
#include "_ckernels.h"

/* a reported point: its value and its position in the row */
typedef struct {
    double v;
    int64_t i;
} point;

/* NATURAL_MERGE_SORT(name, type, LESS) defines `static type *name(type *a, type *tmp,
 * int64_t *runs, int64_t n)`: a stable sort of a[0..n) by LESS(x, y) ("x goes before y"):
 * insertion sort for short rows, else a natural merge sort of the rows' non-decreasing runs
 * (the inputs come nearly in order: few runs), O(n log n) at worst. tmp and runs are scratch
 * of n and n + 1 entries. Returns the array that holds the result: a or tmp. */
#define NATURAL_MERGE_SORT(name, type, LESS)                                                 \
    static type *name(type *a, type *tmp, int64_t *runs, int64_t n)                           \
    {                                                                                         \
        int64_t nr = 0, i, j, r;                                                              \
        type *src = a, *dst = tmp, *swap;                                                     \
        if (n <= 24) {                                                                        \
            for (i = 1; i < n; i++) {                                                         \
                type x = a[i];                                                                \
                for (j = i; j > 0 && LESS(x, a[j - 1]); j--)                                  \
                    a[j] = a[j - 1];                                                          \
                a[j] = x;                                                                     \
            }                                                                                 \
            return a;                                                                         \
        }                                                                                     \
        runs[nr++] = 0;                                                                       \
        for (i = 1; i < n; i++)                                                               \
            if (LESS(a[i], a[i - 1]))                                                         \
                runs[nr++] = i;                                                               \
        runs[nr] = n;                                                                         \
        while (nr > 1) { /* merge runs two by two from src into dst, then swap */             \
            int64_t out_runs = 0;                                                             \
            for (r = 0; r < nr; r += 2) {                                                     \
                int64_t s0 = runs[r];                                                         \
                const type *p, *q, *pe, *qe;                                                  \
                type *o = dst + s0;                                                           \
                if (r + 1 >= nr) { /* an odd run out: copied as it is */                      \
                    memcpy(o, src + s0, (size_t)(n - s0) * sizeof(type));                     \
                    runs[out_runs++] = s0;                                                    \
                    break;                                                                    \
                }                                                                             \
                p = src + s0;                                                                 \
                pe = src + runs[r + 1];                                                       \
                q = pe;                                                                       \
                qe = src + runs[r + 2];                                                       \
                while (p < pe && q < qe) { /* the right one only when strictly less: stable */ \
                    if (LESS(*q, *p))                                                         \
                        *o++ = *q++;                                                          \
                    else                                                                      \
                        *o++ = *p++;                                                          \
                }                                                                             \
                while (p < pe)                                                                \
                    *o++ = *p++;                                                              \
                while (q < qe)                                                                \
                    *o++ = *q++;                                                              \
                runs[out_runs++] = s0;                                                        \
            }                                                                                 \
            runs[out_runs] = n;                                                               \
            nr = out_runs;                                                                    \
            swap = src;                                                                       \
            src = dst;                                                                        \
            dst = swap;                                                                       \
        }                                                                                     \
        return src;                                                                           \
    }

#define POINT_LESS(x, y) ((x).v < (y).v)

/* Stable sort of points by value (no NaN): the clients' non-decreasing lists, merged.
 * As NATURAL_MERGE_SORT, but each merge of two runs (n entries) is two merges at once without
 * a branch on the data: from the front the n / 2 first entries (the left run's when equal),
 * from the back the rest (the right run's last when equal), so the two walks do not wait on
 * each other. A walk whose run is used up may read one entry past it (the other run's, or
 * the one slack entry before and after a and tmp), and does not take it. */
/* c ? x : y for pointers (c 0 or 1) by a mask: compilers turn ?: into a branch here */
#define PICK(c, x, y)                                                                         \
    ((const point *)((uintptr_t)(y)                                                           \
                     ^ (((uintptr_t)(x) ^ (uintptr_t)(y)) & ((uintptr_t)0 - (uintptr_t)(c)))))

static point *stable_sort(point *a, point *tmp, int64_t *runs, int64_t n)
{
    int64_t nr = 0, i, j, r;
    point *src = a, *dst = tmp, *swap;
    if (n <= 24) {
        for (i = 1; i < n; i++) {
            point x = a[i];
            for (j = i; j > 0 && POINT_LESS(x, a[j - 1]); j--)
                a[j] = a[j - 1];
            a[j] = x;
        }
        return a;
    }
    runs[nr++] = 0;
    for (i = 1; i < n; i++)
        if (POINT_LESS(a[i], a[i - 1]))
            runs[nr++] = i;
    runs[nr] = n;
    while (nr > 1) { /* merge runs two by two from src into dst, then swap */
        int64_t out_runs = 0;
        for (r = 0; r < nr; r += 2) {
            int64_t s0 = runs[r], k, h, m2;
            const point *p, *q, *pe, *qe, *pb, *qb, *ps, *qs;
            point *o, *ob;
            if (r + 1 >= nr) { /* an odd run out: copied as it is */
                memcpy(dst + s0, src + s0, (size_t)(n - s0) * sizeof(point));
                runs[out_runs++] = s0;
                break;
            }
            ps = p = src + s0;
            qs = pe = q = src + runs[r + 1];
            qe = src + runs[r + 2];
            pb = pe - 1;
            qb = qe - 1;
            o = dst + s0;
            ob = dst + runs[r + 2] - 1;
            m2 = runs[r + 2] - s0;
            h = m2 / 2;
            for (k = 0; k < h; k++) {
                /* front: the right one only when strictly less (or the left run used up) */
                int tq = (p == pe) | ((q != qe) & POINT_LESS(*q, *p));
                /* back: the right one unless strictly less (or the right run used up) */
                int tb = (qb < qs) | ((pb >= ps) & POINT_LESS(*qb, *pb));
                *o++ = *PICK(tq, q, p);
                q += tq;
                p += !tq;
                *ob-- = *PICK(tb, pb, qb);
                pb -= tb;
                qb -= !tb;
            }
            if (m2 - h > h) /* the middle entry, from the front */
                *o = *PICK((p == pe) | ((q != qe) & POINT_LESS(*q, *p)), q, p);
            runs[out_runs++] = s0;
        }
        runs[out_runs] = n;
        nr = out_runs;
        swap = src;
        src = dst;
        dst = swap;
    }
    return src;
}

/* Stable sort of cuts, NaN last (the cuts come nearly in order). */
NATURAL_MERGE_SORT(sort_doubles, double, lt_nan_last)

/* sort_doubles, the result left in t. */
static void sort_cuts(double *t, double *tmp, int64_t *runs, int64_t n)
{
    double *sorted = sort_doubles(t, tmp, runs, n);
    if (sorted != t)
        memcpy(t, sorted, (size_t)n * sizeof(double));
}

struct scratch {
    double *dsp, *djp, *xs, *s, *F;
    point *pts, *tmp;
    int64_t *runs;
    double *cut_tmp; /* n_bins - 1 entries, and n_bins runs: sort_cuts's scratch */
    int64_t *cut_runs;
};

/* One row: points flat (K, P) NaN-padded, weights (K,), the B - 1 cuts into out. */
static int one_row(const double *flat, const double *weights, int64_t K, int64_t P,
                    int64_t n_bins, double *out, struct scratch *sc)
{
    int64_t c, j, k, b, n = 0, i, e, last_e = -1;
    double slope_max = 0.0, prev_slope = 0.0, tiny, acc_s = 0.0, acc_dj = 0.0, acc_dx = 0.0;
    double *dsp = sc->dsp, *djp = sc->djp, *xs = sc->xs, *s = sc->s, *F = sc->F;
    point *pts = sc->pts;
    const int64_t nt = n_bins - 1;

    /* per reported point, in the row's own order: its slope change (the slope of the segment
     * it starts minus that of the slot before it) and its point mass (_sketch._events).
     * Padding has slope 0 and no mass, so it is left out: it would add zeros to every sum. */
    for (c = 0; c < K; c++) {
        const double *p = flat + c * P;
        int64_t npts = 0, nseg;
        double mass;
        while (npts < P && !isnan(p[npts])) /* the list: its points before the NaN padding */
            npts++;
        for (j = npts; j < P; j++)
            if (!isnan(p[j])) /* a point after the padding: the caller refuses such lists */
                return -1;
        nseg = npts - 1 > 0 ? npts - 1 : 0;
        mass = nseg > 0 ? weights[c] / (double)(nseg > 1 ? nseg : 1) : 0.0;
        prev_slope = 0.0; /* the slot before a list's first point (padding or a list's last
                           * point, which starts no segment) has slope 0 */
        for (j = 0; j < npts; j++) {
            double length = j == npts - 1 ? NAN : p[j + 1] - p[j];
            double sl = length > 0 ? mass / length : 0.0;
            pts[n].v = p[j];
            pts[n].i = n;
            dsp[n] = sl - prev_slope;
            djp[n] = mass * (double)(length == 0);
            if (npts == 1)
                djp[n] += weights[c];
            n++;
            if (sl > slope_max)
                slope_max = sl;
            prev_slope = sl;
        }
    }
    for (b = 0; b < nt; b++)
        out[b] = INFINITY;
    if (n == 0)
        return 0;
    pts = stable_sort(pts, sc->tmp, sc->runs, n);
    tiny = 1e-12 * (slope_max > 1e-300 ? slope_max : 1e-300);
    for (k = 0; k < n; k++)
        xs[k] = pts[k].v;
    for (k = 0; k < n; k++) { /* numpy's cumulative sums, one term at a time */
        double sk;
        acc_s = k == 0 ? dsp[pts[0].i] : acc_s + dsp[pts[k].i];
        sk = fabs(acc_s) <= tiny ? 0.0 : acc_s;
        s[k] = sk;
        acc_dj = k == 0 ? djp[pts[0].i] : acc_dj + djp[pts[k].i];
        F[k] = k == 0 ? acc_dj : acc_dj + acc_dx;
        if (k + 1 < n) {
            double dx = sk * (xs[k + 1] - xs[k]);
            acc_dx = k == 0 ? dx : acc_dx + dx;
        }
    }
    /* the inverse of the pooled CDF at u = b / B (_sketch._pooled): F is non-decreasing and
     * the levels increase, so the first event reaching each level is found by one walk */
    i = 0;
    for (b = 0; b < nt; b++) {
        double u = (double)(b + 1) / (double)n_bins, target = u - 1e-12;
        double F_prev, s_prev, x_prev, x_i, left_limit, interp, t;
        int64_t ii, prev;
        int ramp, inside_ramp;
        while (i < n && F[i] < target)
            i++;
        ii = i < n ? i : n - 1;
        prev = ii - 1 > 0 ? ii - 1 : 0;
        F_prev = F[prev];
        s_prev = s[prev];
        x_prev = xs[prev];
        x_i = xs[ii];
        left_limit = F_prev + s_prev * (x_i - x_prev);
        interp = x_prev + (u - F_prev) / s_prev;
        ramp = (ii > 0) && (s_prev > 0) && (u <= left_limit + 1e-12);
        t = ramp ? interp : x_i;
        t = clip(t, x_prev, x_i);
        inside_ramp = ramp && (u < left_limit - 1e-12) && (t < x_i);
        if (!inside_ramp) { /* a cut at an event: to the middle of a flat gap after it */
            double nxt;
            int has_next;
            if (!(last_e >= 0 && xs[last_e] == x_i)) /* else the same run as the last cut */
                for (last_e = ii; last_e + 1 < n && xs[last_e + 1] <= x_i; last_e++)
                    ;
            e = last_e;
            has_next = e + 1 < n;
            nxt = xs[has_next ? e + 1 : e];
            t = (has_next && s[e] == 0 && nxt > x_i) ? (x_i + nxt) / 2.0 : x_i;
        }
        out[b] = t + 0.0; /* -0.0 becomes 0.0, as in numpy's */
    }
    sort_cuts(out, sc->cut_tmp, sc->cut_runs, nt);
    for (b = nt - 1; b >= 1; b--) /* from the end: each compared with its sorted neighbour */
        if (out[b] == out[b - 1])
            out[b] = INFINITY;
    sort_cuts(out, sc->cut_tmp, sc->cut_runs, nt);
    return 0;
}

PyObject *pooled_rows(PyObject *self, PyObject *args)
{
    PyObject *o[3];
    Py_buffer v[3];
    Py_ssize_t R, K, P, n_bins;
    struct scratch sc;
    int64_t W, r;
    int got = 0, bad = 0;
    char *mem;
    static const char *fmt[3] = {"d", "d", "d"};
    static const char *name[3] = {"points", "weights", "out"};
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOnnnn", &o[0], &o[1], &o[2], &R, &K, &P, &n_bins))
        return NULL;
    if (R < 0 || K < 1 || P < 1 || n_bins < 2 || K > MAX_WIDTH || P > MAX_WIDTH
        || n_bins > MAX_WIDTH) {
        PyErr_SetString(PyExc_ValueError, "pooled_rows: bad shape");
        return NULL;
    }
    if (get_buffers(o, v, fmt, name, 3, 2, &got) != 0)
        goto done;
    W = (int64_t)K * P;
    if (!bytes_eq(v[0].len, R, K, P) || !bytes_eq(v[1].len, R, K, 1)
        || !bytes_eq(v[2].len, R, n_bins - 1, 1)) {
        PyErr_SetString(PyExc_ValueError, "pooled_rows: array sizes do not match the shape");
        goto done;
    }
    /* pts and tmp: one slack point before and after each (stable_sort may read them) */
    mem = malloc((size_t)W * (5 * sizeof(double) + 2 * sizeof(point) + sizeof(int64_t))
                 + 4 * sizeof(point) + sizeof(int64_t)
                 + (size_t)n_bins * (sizeof(double) + sizeof(int64_t)));
    if (mem == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    sc.dsp = (double *)mem;
    sc.djp = sc.dsp + W;
    sc.xs = sc.djp + W;
    sc.s = sc.xs + W;
    sc.F = sc.s + W;
    sc.pts = (point *)(sc.F + W) + 1;
    sc.tmp = sc.pts + W + 2;
    sc.runs = (int64_t *)(sc.tmp + W + 1);
    sc.pts[-1].v = sc.pts[W].v = sc.tmp[-1].v = sc.tmp[W].v = 0.0; /* read, never taken */
    sc.pts[-1].i = sc.pts[W].i = sc.tmp[-1].i = sc.tmp[W].i = 0;
    sc.cut_runs = sc.runs + W + 1;
    sc.cut_tmp = (double *)(sc.cut_runs + n_bins);
    Py_BEGIN_ALLOW_THREADS
    for (r = 0; r < R && !bad; r++)
        bad = one_row((const double *)v[0].buf + r * W, (const double *)v[1].buf + r * K, K,
                      P, n_bins, (double *)v[2].buf + r * (n_bins - 1), &sc);
    Py_END_ALLOW_THREADS
    free(mem);
    if (bad)
        PyErr_SetString(PyExc_ValueError,
                        "pooled_rows: a client's list has a point after its NaN padding");
done:
    return finish(v, got, Py_NewRef(Py_None));
}

/* The length of each NaN-padded list of points (N, P): its points before the first NaN.
 * Returns -1, or the first list with a point after its padding (lengths then partly
 * written). */
PyObject *list_lengths(PyObject *self, PyObject *args)
{
    PyObject *o[2];
    Py_buffer v[2];
    Py_ssize_t P, N = 0, i, bad = -1;
    int got = 0;
    static const char *fmt[2] = {"d", "q"};
    static const char *name[2] = {"points", "lengths"};
    (void)self;
    if (!PyArg_ParseTuple(args, "OOn", &o[0], &o[1], &P))
        return NULL;
    if (P < 1) {
        PyErr_SetString(PyExc_ValueError, "list_lengths: P must be >= 1");
        return NULL;
    }
    if (get_buffers(o, v, fmt, name, 2, 1, &got) != 0)
        goto done;
    N = v[1].len / 8;
    if (!bytes_eq(v[0].len, N, P, 1)) {
        PyErr_SetString(PyExc_ValueError, "list_lengths: array sizes do not match");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        const double *p = v[0].buf;
        int64_t *len = v[1].buf;
        for (i = 0; i < N; i++) {
            const double *row = p + i * P;
            Py_ssize_t j = 0, k;
            while (j < P && !isnan(row[j]))
                j++;
            len[i] = j;
            for (k = j + 1; k < P; k++)
                if (!isnan(row[k])) {
                    bad = i;
                    break;
                }
            if (bad >= 0)
                break;
        }
    }
    Py_END_ALLOW_THREADS
done:
    return finish(v, got, PyLong_FromSsize_t(bad));
}

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
    if (PyObject_GetBuffer(o_codes, &vc, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0)
        goto done;
    gotc = 1;
    cf = vc.format[0] == '<' || vc.format[0] == '=' || vc.format[0] == '@' ? vc.format + 1
                                                                            : vc.format;
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
