/* The quantile sketches: the coordinator's pooled-CDF candidates (pooled_rows, pooled_lists,
 * list_lengths); a worker's level-order keys and quantile points are in _ckernels_order.c.
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

/* One row: client c's NaN-padded list of P points at lists[c] + off, weights (K,), the B - 1
 * cuts into out. */
static int one_row(const double *const *lists, int64_t off, const double *weights, int64_t K,
                   int64_t P, int64_t n_bins, double *out, struct scratch *sc)
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
        const double *p = lists[c] + off;
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

/* The rows of pooled_rows and pooled_lists: row r's list of client c at lists[c] + r * stride,
 * its weights at weights + r * K, its cuts at out + r * (n_bins - 1); rows with keep[r] == 0
 * (keep NULL: none) are left as they are. Returns 1 (error set) on a list with a point after
 * its padding or no memory. */
static int pooled_run(const double *const *lists, int64_t stride, const double *weights,
                      const int64_t *keep, double *out, int64_t R, int64_t K, int64_t P,
                      int64_t n_bins, const char *fname)
{
    struct scratch sc;
    int64_t W = K * P, r;
    int bad = 0;
    /* pts and tmp: one slack point before and after each (stable_sort may read them) */
    char *mem = malloc((size_t)W * (5 * sizeof(double) + 2 * sizeof(point) + sizeof(int64_t))
                       + 4 * sizeof(point) + sizeof(int64_t)
                       + (size_t)n_bins * (sizeof(double) + sizeof(int64_t)));
    if (mem == NULL) {
        PyErr_NoMemory();
        return 1;
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
        if (keep == NULL || keep[r])
            bad = one_row(lists, r * stride, weights + r * K, K, P, n_bins,
                          out + r * (n_bins - 1), &sc);
    Py_END_ALLOW_THREADS
    free(mem);
    if (bad)
        PyErr_Format(PyExc_ValueError, "%s: a client's list has a point after its NaN padding",
                     fname);
    return bad != 0;
}

/* the shape arguments of pooled_rows and pooled_lists, checked; 0 or -1 (error set) */
static int pooled_shape(Py_ssize_t R, Py_ssize_t K, Py_ssize_t P, Py_ssize_t n_bins,
                        const char *fname)
{
    if (R < 0 || K < 1 || P < 1 || n_bins < 2 || K > MAX_WIDTH || P > MAX_WIDTH
        || n_bins > MAX_WIDTH) {
        PyErr_Format(PyExc_ValueError, "%s: bad shape", fname);
        return -1;
    }
    return 0;
}

PyObject *pooled_rows(PyObject *self, PyObject *args)
{
    PyObject *o[3];
    Py_buffer v[3];
    Py_ssize_t R, K, P, n_bins;
    const double **lists = NULL;
    int64_t c;
    int got = 0;
    static const char *fmt[3] = {"d", "d", "d"};
    static const char *name[3] = {"points", "weights", "out"};
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOnnnn", &o[0], &o[1], &o[2], &R, &K, &P, &n_bins))
        return NULL;
    if (pooled_shape(R, K, P, n_bins, "pooled_rows") != 0)
        return NULL;
    if (get_buffers(o, v, fmt, name, 3, 2, &got) != 0)
        goto done;
    if (!bytes_eq(v[0].len, R, K, P) || !bytes_eq(v[1].len, R, K, 1)
        || !bytes_eq(v[2].len, R, n_bins - 1, 1)) {
        PyErr_SetString(PyExc_ValueError, "pooled_rows: array sizes do not match the shape");
        goto done;
    }
    lists = malloc((size_t)K * sizeof(*lists));
    if (lists == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (c = 0; c < K; c++) /* a row holds the K lists one after the other */
        lists[c] = (const double *)v[0].buf + c * P;
    pooled_run(lists, (int64_t)K * P, v[1].buf, NULL, v[2].buf, R, K, P, n_bins,
               "pooled_rows");
done:
    free((void *)lists);
    return finish(v, got, Py_NewRef(Py_None));
}

/* pooled_rows of rows whose clients' lists are K separate arrays (R, P), one per client (no
 * (R, K, P) copy of them), for the rows with keep[r] != 0 (the others' cuts left as they
 * are). */
PyObject *pooled_lists(PyObject *self, PyObject *args)
{
    PyObject *seq, *o[3], *fast = NULL;
    Py_buffer v[3], *vl = NULL;
    Py_ssize_t R, K, P, n_bins, c, gotl = 0;
    const double **lists = NULL;
    int got = 0;
    static const char *fmt[3] = {"d", "q", "d"};
    static const char *name[3] = {"weights", "keep", "out"};
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOnnnn", &seq, &o[0], &o[1], &o[2], &R, &K, &P, &n_bins))
        return NULL;
    if (pooled_shape(R, K, P, n_bins, "pooled_lists") != 0)
        return NULL;
    fast = PySequence_Fast(seq, "pooled_lists: lists must be a sequence of arrays");
    if (fast == NULL)
        return NULL;
    if (PySequence_Fast_GET_SIZE(fast) != K) {
        PyErr_SetString(PyExc_ValueError, "pooled_lists: one array of lists per client");
        goto done;
    }
    if (get_buffers(o, v, fmt, name, 3, 2, &got) != 0)
        goto done;
    if (!bytes_eq(v[0].len, R, K, 1) || !bytes_eq(v[1].len, R, 1, 1)
        || !bytes_eq(v[2].len, R, n_bins - 1, 1)) {
        PyErr_SetString(PyExc_ValueError, "pooled_lists: array sizes do not match the shape");
        goto done;
    }
    vl = malloc((size_t)K * sizeof(*vl));
    lists = malloc((size_t)K * sizeof(*lists));
    if (vl == NULL || lists == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; gotl < K; gotl++) {
        if (get_buffer(PySequence_Fast_GET_ITEM(fast, gotl), &vl[gotl], "d", 0, "lists") != 0)
            goto done;
        if (!bytes_eq(vl[gotl].len, R, P, 1)) {
            PyErr_SetString(PyExc_ValueError, "pooled_lists: a client's lists are not (R, P)");
            gotl++;
            goto done;
        }
        lists[gotl] = vl[gotl].buf;
    }
    pooled_run(lists, P, v[0].buf, v[1].buf, v[2].buf, R, K, P, n_bins, "pooled_lists");
done:
    for (c = 0; c < gotl; c++)
        PyBuffer_Release(&vl[c]);
    free(vl);
    free((void *)lists);
    Py_DECREF(fast);
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
