/* Compiled loops of the engine's hot paths: the pooled-CDF candidates (fedforest_secure._sketch),
 * a worker's quantile points and histograms (fedforest_secure._level_stats, _grid_stats), the
 * secure sketch's prior (fedforest_secure._secure_cdf), and the fixed-point encoding of secure
 * aggregation (fedforest_secure.secagg._primitives._ring).
 *
 * pooled_rows computes, row by row, what fedforest_secure._sketch._pooled computes with numpy
 * for rows whose clients' mixing weights sum to 1: the pooled sketch CDF tabulated at every
 * reported point (_sketch._events), inverted at b / B (b = 1..B-1), cuts at a flat stretch
 * moved to the middle of the gap (_sketch._mid_gap), then sorted with duplicates replaced by
 * +inf. Every floating-point operation is the one numpy performs, in the same order (running
 * sums are sequential, as numpy's cumsum), so both give the same bits; the module is built
 * with -ffp-contract=off so that no multiply-add is fused. The numpy code is the reference
 * and the fallback where this module is not built (tests/test_sketch_kernels.py compares
 * them).
 *
 * Arrays come through the buffer protocol (C-contiguous float64 / int64); the GIL is released
 * while the rows are computed.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* a < b with NaN after every number (numpy's sort order) */
static inline int lt_nan_last(double a, double b)
{
    if (isnan(a))
        return 0;
    if (isnan(b))
        return 1;
    return a < b;
}

/* a reported point: its value and its position in the row */
typedef struct {
    double v;
    int64_t i;
} point;

/* Stable sort of pts[0..n) by value (no NaN): insertion sort for short rows, else a natural
 * merge sort, since the input is made of the clients' non-decreasing lists. tmp and runs are
 * scratch of n and n + 1 entries. Returns the array that holds the result: pts or tmp. */
static point *stable_sort(point *pts, point *tmp, int64_t *runs, int64_t n)
{
    int64_t nr = 0, i, j, r;
    point *src = pts, *dst = tmp, *swap;
    if (n <= 24) {
        for (i = 1; i < n; i++) {
            point x = pts[i];
            for (j = i; j > 0 && x.v < pts[j - 1].v; j--)
                pts[j] = pts[j - 1];
            pts[j] = x;
        }
        return pts;
    }
    runs[nr++] = 0;
    for (i = 1; i < n; i++)
        if (pts[i].v < pts[i - 1].v)
            runs[nr++] = i;
    runs[nr] = n;
    while (nr > 1) { /* merge runs two by two from src into dst, then swap */
        int64_t out_runs = 0;
        for (r = 0; r < nr; r += 2) {
            int64_t a = runs[r];
            const point *p, *q, *pe, *qe;
            point *o = dst + a;
            if (r + 1 >= nr) { /* an odd run out: copied as it is */
                memcpy(o, src + a, (size_t)(n - a) * sizeof(point));
                runs[out_runs++] = a;
                break;
            }
            p = src + a;
            pe = src + runs[r + 1];
            q = pe;
            qe = src + runs[r + 2];
            while (p < pe && q < qe) { /* the right one only when strictly smaller: stable */
                if (q->v < p->v)
                    *o++ = *q++;
                else
                    *o++ = *p++;
            }
            while (p < pe)
                *o++ = *p++;
            while (q < qe)
                *o++ = *q++;
            runs[out_runs++] = a;
        }
        runs[out_runs] = n;
        nr = out_runs;
        swap = src;
        src = dst;
        dst = swap;
    }
    return src;
}

/* numpy's clip(t, lo, hi) for doubles: maximum then minimum, NaN propagated */
static inline double clip(double t, double lo, double hi)
{
    double m = isnan(t) ? t : (t > lo ? t : lo);
    return isnan(m) ? m : (m < hi ? m : hi);
}

/* insertion sort of a short row, NaN last (stable) */
static void sort_short(double *t, int64_t n)
{
    int64_t i, j;
    for (i = 1; i < n; i++) {
        double v = t[i];
        for (j = i; j > 0 && lt_nan_last(v, t[j - 1]); j--)
            t[j] = t[j - 1];
        t[j] = v;
    }
}

struct scratch {
    double *dsp, *djp, *xs, *s, *F;
    point *pts, *tmp;
    int64_t *runs;
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
    sort_short(out, nt);
    for (b = nt - 1; b >= 1; b--) /* from the end: each compared with its sorted neighbour */
        if (out[b] == out[b - 1])
            out[b] = INFINITY;
    sort_short(out, nt);
    return 0;
}

static int get_buffer(PyObject *obj, Py_buffer *view, const char *fmt, int writable,
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
static int get_buffers(PyObject **o, Py_buffer *v, const char *const *fmt,
                       const char *const *name, int n, int writable, int *got)
{
    for (*got = 0; *got < n; (*got)++)
        if (get_buffer(o[*got], &v[*got], fmt[*got], *got == writable, name[*got]) != 0)
            return -1;
    return 0;
}

/* The end of a call: the n buffers released, then its result, or NULL (result dropped)
 * where an error was set. */
static PyObject *finish(Py_buffer *v, int n, PyObject *result)
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
static int bytes_eq(Py_ssize_t len, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c)
{
    Py_ssize_t t;
    if (a < 0 || b < 0 || c < 0 || __builtin_mul_overflow(a, b, &t)
        || __builtin_mul_overflow(t, c, &t) || __builtin_mul_overflow(t, (Py_ssize_t)8, &t))
        return 0;
    return t == len;
}

/* 1 if len (bytes) is at least 8 * a * b, without overflow */
static int bytes_at_least(Py_ssize_t len, Py_ssize_t a, Py_ssize_t b)
{
    Py_ssize_t t;
    if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &t)
        || __builtin_mul_overflow(t, (Py_ssize_t)8, &t))
        return 0;
    return len >= t;
}

/* the largest sketch size, number of statistics or of bins a call takes */
#define MAX_WIDTH ((Py_ssize_t)1 << 24)

/* A field of the level order's entries: an integer array (numpy's uint8, uint16, uint32, or
 * 64-bit) read as (value >> shift) & mask: a packed key holds several. */
typedef struct {
    const char *p;
    Py_ssize_t n;
    int size;
    int shift;
    uint64_t mask;
} field;

/* Entry i of a field. Its item size may be given where the call is compiled (1, 2, 4 or 8;
 * 0: read from the field): the loops below are compiled once per layout the level order uses
 * (a packed key; compact 16-bit codes and rows with 8-bit weights) and once for any other. */
static inline __attribute__((always_inline)) int64_t fgetk(const field *f, Py_ssize_t i,
                                                           int size)
{
    uint64_t v;
    switch (size ? size : f->size) {
    case 1:
        v = ((const uint8_t *)f->p)[i];
        break;
    case 2:
        v = ((const uint16_t *)f->p)[i];
        break;
    case 4:
        v = ((const uint32_t *)f->p)[i];
        break;
    default:
        v = ((const uint64_t *)f->p)[i];
    }
    return (int64_t)((v >> f->shift) & f->mask);
}

/* which compiled variant reads fields of these item sizes: 8 (a packed key), 2 (compact
 * arrays: codes and rows of 16 bits, weights of 8), 0 (any) */
static int layout_of(const field *code, const field *row, const field *w)
{
    if (code->size == 8 && row->size == 8 && w->size == 8)
        return 8;
    if (code->size == 2 && row->size == 2 && w->size == 1)
        return 2;
    return 0;
}

/* the buffer of a C-contiguous integer array (signed or unsigned, 1, 2, 4 or 8 bytes) */
static int get_field(PyObject *obj, Py_buffer *view, Py_ssize_t shift, unsigned long long mask,
                     field *f, const char *name)
{
    const char *fmt;
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0)
        return -1;
    fmt = view->format;
    if (fmt[0] == '<' || fmt[0] == '=' || fmt[0] == '@')
        fmt++;
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

static PyObject *pooled_rows(PyObject *self, PyObject *args)
{
    PyObject *o_pts, *o_w, *o_out;
    Py_ssize_t R, K, P, n_bins;
    Py_buffer pts, w, out;
    struct scratch sc;
    int64_t W, r;
    int bad = 0;
    char *mem;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOnnnn", &o_pts, &o_w, &o_out, &R, &K, &P, &n_bins))
        return NULL;
    if (R < 0 || K < 1 || P < 1 || n_bins < 2 || K > MAX_WIDTH || P > MAX_WIDTH
        || n_bins > MAX_WIDTH) {
        PyErr_SetString(PyExc_ValueError, "pooled_rows: bad shape");
        return NULL;
    }
    if (get_buffer(o_pts, &pts, "d", 0, "points") != 0)
        return NULL;
    if (get_buffer(o_w, &w, "d", 0, "weights") != 0) {
        PyBuffer_Release(&pts);
        return NULL;
    }
    if (get_buffer(o_out, &out, "d", 1, "out") != 0) {
        PyBuffer_Release(&pts);
        PyBuffer_Release(&w);
        return NULL;
    }
    W = (int64_t)K * P;
    if (!bytes_eq(pts.len, R, K, P) || !bytes_eq(w.len, R, K, 1)
        || !bytes_eq(out.len, R, n_bins - 1, 1)) {
        PyErr_SetString(PyExc_ValueError, "pooled_rows: array sizes do not match the shape");
        goto fail;
    }
    mem = malloc((size_t)W * (5 * sizeof(double) + 2 * sizeof(point) + sizeof(int64_t))
                 + sizeof(int64_t));
    if (mem == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    sc.dsp = (double *)mem;
    sc.djp = sc.dsp + W;
    sc.xs = sc.djp + W;
    sc.s = sc.xs + W;
    sc.F = sc.s + W;
    sc.pts = (point *)(sc.F + W);
    sc.tmp = sc.pts + W;
    sc.runs = (int64_t *)(sc.tmp + W);
    Py_BEGIN_ALLOW_THREADS
    for (r = 0; r < R && !bad; r++)
        bad = one_row((const double *)pts.buf + r * W, (const double *)w.buf + r * K, K, P,
                      n_bins, (double *)out.buf + r * (n_bins - 1), &sc);
    Py_END_ALLOW_THREADS
    free(mem);
    if (bad) {
        PyErr_SetString(PyExc_ValueError,
                        "pooled_rows: a client's list has a point after its NaN padding");
        goto fail;
    }
    PyBuffer_Release(&pts);
    PyBuffer_Release(&w);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
fail:
    PyBuffer_Release(&pts);
    PyBuffer_Release(&w);
    PyBuffer_Release(&out);
    return NULL;
}

/* One block s0 .. e0 of sketch_values (fields: weights, codes of item sizes ws, cs): its
 * points into o2. vals are the feature's values (nv of them), miss its missing code (-1:
 * none). Returns 1 on a code out of range or weights that overflow. */
static inline __attribute__((always_inline)) int
sketch_block(const field *fl, int ws, int cs, int64_t s0, int64_t e0, int64_t miss,
             const double *vals, int64_t nv, double *o2, int64_t n_points, int64_t r)
{
    int64_t j, b, bk, total = 0, cum, pos;
    if (miss >= 0) /* missing codes sort last in a block: the sketch ignores them */
        while (e0 > s0 && fgetk(&fl[1], e0 - 1, cs) >= miss)
            e0--;
    if (e0 <= s0)
        return 0;
    for (j = s0; j < e0; j++)
        if (__builtin_add_overflow(total, fgetk(&fl[0], j, ws), &total) || total < 0)
            return 1;
    bk = n_points;
    if (r >= 1) {
        bk = total / r;
        if (bk > n_points)
            bk = n_points;
        if (bk < 1)
            return 0;
    }
    pos = s0;
    cum = fgetk(&fl[0], s0, ws);
    for (b = 0; b <= bk; b++) {
        int64_t target, code;
        if (__builtin_mul_overflow(b, total, &target)
            || __builtin_add_overflow(target, bk - 1, &target))
            return 1;
        target /= bk;
        if (target < 1)
            target = 1;
        while (cum < target && pos + 1 < e0)
            cum += fgetk(&fl[0], ++pos, ws);
        code = fgetk(&fl[1], pos, cs);
        if (code < 0 || code >= nv)
            return 1;
        o2[b] = vals[code];
    }
    return 0;
}

/* The worker's quantile sketch (fedforest_secure._level_stats.LevelStatistics.quantile_points):
 * for every block i of the level's sorted order (entries edges[i] .. edges[i + 1], positive
 * integer weights and codes read from fields, see field) where wanted[i], its B_k + 1
 * quantile points Q(b / B_k), b = 0..B_k: the value of the first entry whose cumulative
 * weight within the block reaches max(ceil(b W / B_k), 1) (W the block's weight), at most the
 * block's last entry. Missing values (code >= missing[f], the block's last entries) are left
 * out. B_k is n_points, or min(W // r, n_points) with r >= 1 (adaptive B; no point where that
 * is 0). A value is uniq_all[uniq_off[f] + code], f = feat[i]; out (n_blocks, n_points + 1)
 * gets them, NaN in its other slots. */
static PyObject *sketch_values(PyObject *self, PyObject *args)
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
            for (b = 0; b <= n_points; b++) /* NaN: no point (the blocks' lists' padding) */
                o2[b] = NAN;
            if (!wanted[i] || e0 <= s0)
                continue;
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
 * missing values); out (len(blocks), W + 1, S) is added to. */
static PyObject *histogram_blocks(PyObject *self, PyObject *args)
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
    if (S < 1 || S > MAX_WIDTH || (mode != 0 && mode != 1) || !bytes_eq(v[0].len, nblk + 1, 1, 1)
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
        for (q = 0; q < n_eval && !bad; q++) {
            int64_t b = blocks[q], f, e0, e1;
            const double *t = thr + q * W;
            if (b < 0 || b >= nblk) {
                bad = 1;
                break;
            }
            f = feat[b];
            e0 = edges[b];
            e1 = edges[b + 1];
            if (e0 >= e1)
                continue;
            if (f < 0 || f >= nf || e0 < 0 || e1 > fl[0].n || uoff[f] < 0 || uoff[f] > nu) {
                bad = 1;
                break;
            }
            if (lay == 8)
                bad = hist_entries(fl, 8, 8, 8, e0, e1, miss ? miss[f] : -1, uall + uoff[f],
                                   nu - uoff[f], t, W, out + q * (W + 1) * S, S, mode, y, ny);
            else if (lay == 2)
                bad = hist_entries(fl, 2, 2, 1, e0, e1, miss ? miss[f] : -1, uall + uoff[f],
                                   nu - uoff[f], t, W, out + q * (W + 1) * S, S, mode, y, ny);
            else
                bad = hist_entries(fl, 0, 0, 0, e0, e1, miss ? miss[f] : -1, uall + uoff[f],
                                   nu - uoff[f], t, W, out + q * (W + 1) * S, S, mode, y, ny);
        }
    }
    Py_END_ALLOW_THREADS
    if (bad)
        PyErr_SetString(PyExc_ValueError,
                        "histogram_blocks: an entry's block, value, row or class is out of range");
done:
    for (k = 0; k < gotf; k++)
        PyBuffer_Release(&vf[k]);
    return finish(v, got, Py_NewRef(Py_None));
}

/* A worker's histogram without a sorted order (fedforest_secure._grid_stats.bin_statistics):
 * slot by slot, every pair (node, row, weight) of an evaluated node (pos[node] >= 0) whose
 * slot has a feature finds its bin, the number of its (node, slot)'s sorted thresholds below
 * its value, by a binary search, and adds its statistics to it, pairs in their order (as one
 * numpy bincount per slot): mode 0 the weight, weight * y, weight * y * y (S of them); mode
 * 1 the weight into column y (a class code). A missing value (code past the feature's
 * distinct values, with has_missing) goes to bin W + 1 with missing_bin, else nowhere.
 * out (E, m, nb, S) is added to, nb = W + 1 + missing_bin. */
static PyObject *grid_sums(PyObject *self, PyObject *args)
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
        for (s = 0; s < m && !bad; s++) {
            for (i = 0; i < P; i++) {
                int64_t nd = node[i], e, f, r, at, code, bin;
                double x, wi;
                const double *t;
                double *cell;
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
static PyObject *marginal_at(PyObject *self, PyObject *args)
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

/* The secure sketch's candidates (fedforest_secure._secure_cdf.SecureCdfPlanner._pick): for
 * each row q (grid row rows[q]) with cells' counts (W + 1 per row), their total and the grid's
 * edges (W per row, +inf padded), for b = 1 .. B - 1 below bnu the edge whose pooled CDF
 * (cumulative count / total; 3.0 at padding) is nearest to b / bnu (the lower one on a tie),
 * found as numpy's searchsorted over the rows laid end to end at offsets 4 q; sorted, repeats
 * and b >= bnu given W. pick (len(rows), B - 1). */
static PyObject *grid_picks(PyObject *self, PyObject *args)
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
static PyObject *encode_values(PyObject *self, PyObject *args)
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

/* The keys of a level order (fedforest_secure._order.LevelOrder): for slot s and pair p
 * (node[p], row[p], weight[p]), keys[s, p] = (codes[fstart[node, s] + row] << shift | base) +
 * (s << hi), base = (node * m) << hi | row << 8 | weight when packed, else (node * m) << hi;
 * INT64_MAX (sorts last) where the node's slot is unused (unused[node, s]). codes are int32.
 * Returns the number of unused keys. */
static PyObject *order_keys(PyObject *self, PyObject *args)
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

/* The length of each NaN-padded list of points (N, P): its points before the first NaN.
 * Returns -1, or the first list with a point after its padding (lengths then partly
 * written). */
static PyObject *list_lengths(PyObject *self, PyObject *args)
{
    PyObject *o_pts, *o_out;
    Py_buffer pts, out;
    Py_ssize_t P, N, i, bad = -1;
    (void)self;
    if (!PyArg_ParseTuple(args, "OOn", &o_pts, &o_out, &P))
        return NULL;
    if (P < 1) {
        PyErr_SetString(PyExc_ValueError, "list_lengths: P must be >= 1");
        return NULL;
    }
    if (get_buffer(o_pts, &pts, "d", 0, "points") != 0)
        return NULL;
    if (get_buffer(o_out, &out, "q", 1, "lengths") != 0) {
        PyBuffer_Release(&pts);
        return NULL;
    }
    N = out.len / 8;
    if (!bytes_eq(pts.len, N, P, 1)) {
        PyErr_SetString(PyExc_ValueError, "list_lengths: array sizes do not match");
        PyBuffer_Release(&pts);
        PyBuffer_Release(&out);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        const double *p = pts.buf;
        int64_t *len = out.buf;
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
    PyBuffer_Release(&pts);
    PyBuffer_Release(&out);
    return PyLong_FromSsize_t(bad);
}

static PyMethodDef methods[] = {
    {"pooled_rows", pooled_rows, METH_VARARGS,
     "pooled_rows(points, weights, out, R, K, P, n_bins): the pooled-CDF candidates of R rows "
     "(points (R, K, P), weights (R, K) summing to 1 per row) written into out (R, n_bins - 1)."},
    {"sketch_values", sketch_values, METH_VARARGS,
     "sketch_values(weights, shift, mask, codes, shift, mask, edges, wanted, feat, uniq_off, "
     "uniq_all, missing, out, n_points, r): every wanted block's quantile points into out."},
    {"histogram_blocks", histogram_blocks, METH_VARARGS,
     "histogram_blocks(codes, shift, mask, rows, shift, mask, weights, shift, mask, edges, "
     "blocks, feat, uniq_off, uniq_all, missing, thr, y, out, S, mode): every evaluated "
     "block's entries' statistics added to their bins of out."},
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
    {"order_keys", order_keys, METH_VARARGS,
     "order_keys(node, row, weight, codes, fstart, unused, keys, m, shift, hi, packed) -> "
     "number of unused keys: a level order's keys, slot by slot."},
    {"list_lengths", list_lengths, METH_VARARGS,
     "list_lengths(points, lengths, P) -> -1 or the first list with a point after its NaN "
     "padding: each list's points before its padding."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ckernels", "Compiled loops of the engine's hot paths.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ckernels(void)
{
    return PyModule_Create(&module);
}
