/* The coordinator's split scores (best_moments): fedforest_secure._splits._best_numeric for a
 * regression's (n, sum y) histograms without a missing-value bin, every node in one pass. */
#include "_ckernels.h"

/* n * impurity of (n, s) up to the node's sum of y^2 (_impurity.weighted_impurity of two
 * statistics): -(s * s / n) where n > 0, else -0.0 (numpy's negated 0.0) */
static inline double wimp2(double n, double s)
{
    return -(n > 0 ? s * s / n : 0.0);
}

/* For every node e of hist (E, m, bt + 1, 2) (bins of (n, sum y)) with thresholds thr
 * (E, m, bt) and valid (E, m) (slots holding a numeric feature): the candidate (slot s,
 * threshold b) of the largest gain wimp(total) - wimp(left) - wimp(right), left the bins
 * 0..b summed one after the other and total all of the slot's bins, among the candidates with
 * a finite threshold, a valid slot and both children's n >= min_leaf and > 0 (-inf for the
 * others); the first of equal gains, or the first NaN, as numpy's argmax. Writes its gain,
 * slot, b, left statistics (E, 2) and whether the left child has more rows (1) or not (0). */
PyObject *best_moments(PyObject *self, PyObject *args)
{
    PyObject *o[8];
    Py_buffer v[8];
    Py_ssize_t E, m, bt;
    double min_leaf;
    int got = 0;
    static const char *fmt[8] = {"d", "d", "q", "d", "q", "q", "d", "q"};
    static const char *name[8] = {"hist", "thr", "valid", "gain", "slot", "index", "left",
                                  "more_left"};
    (void)self;
    if (!PyArg_ParseTuple(args, "OOOOOOOOnnnd", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5],
                          &o[6], &o[7], &E, &m, &bt, &min_leaf))
        return NULL;
    if (E < 0 || m < 1 || m > MAX_WIDTH || bt < 1 || bt > MAX_WIDTH) {
        PyErr_SetString(PyExc_ValueError, "best_moments: bad shape");
        return NULL;
    }
    if (get_buffers(o, v, fmt, name, 8, -1, &got) != 0)
        goto done;
    if (v[3].readonly || v[4].readonly || v[5].readonly || v[6].readonly || v[7].readonly
        || !bytes_eq(v[0].len, E, m, 2 * (bt + 1)) || !bytes_eq(v[1].len, E, m, bt)
        || !bytes_eq(v[2].len, E, m, 1) || !bytes_eq(v[3].len, E, 1, 1)
        || !bytes_eq(v[4].len, E, 1, 1) || !bytes_eq(v[5].len, E, 1, 1)
        || !bytes_eq(v[6].len, E, 2, 1) || !bytes_eq(v[7].len, E, 1, 1)) {
        PyErr_SetString(PyExc_ValueError, "best_moments: array sizes do not match");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    {
        const double *hist = v[0].buf, *thr = v[1].buf;
        const int64_t *valid = v[2].buf;
        double *gain = v[3].buf, *left = v[6].buf;
        int64_t *slot = v[4].buf, *index = v[5].buf, *more_left = v[7].buf;
        Py_ssize_t e, s, b;
        for (e = 0; e < E; e++) {
            double best = -INFINITY, best_n = 0.0, best_s = 0.0, best_tn = 0.0;
            int64_t best_slot = 0, best_b = 0, found_nan = 0, first = 1;
            for (s = 0; s < m && !found_nan; s++) {
                const double *h = hist + ((e * m + s) * (bt + 1)) * 2;
                const double *t = thr + (e * m + s) * bt;
                double tn = h[0], ts = h[1], ln, ls, w_tot;
                int ok_slot = valid[e * m + s] != 0;
                for (b = 1; b <= bt; b++) { /* the total: the bins added one after the other */
                    tn += h[2 * b];
                    ts += h[2 * b + 1];
                }
                w_tot = wimp2(tn, ts);
                ln = 0.0;
                ls = 0.0;
                for (b = 0; b < bt; b++) {
                    double rn, rs, g, cl_n = b == 0 ? h[0] : ln + h[2 * b],
                                      cl_s = b == 0 ? h[1] : ls + h[2 * b + 1];
                    ln = cl_n;
                    ls = cl_s;
                    rn = tn - ln;
                    rs = ts - ls;
                    g = w_tot - wimp2(ln, ls) - wimp2(rn, rs);
                    if (!(ok_slot && isfinite(t[b]) && ln >= min_leaf && rn >= min_leaf
                          && ln > 0 && rn > 0))
                        g = -INFINITY;
                    /* numpy's argmax: the first NaN, else the first largest */
                    if (first || isnan(g) || g > best) {
                        best = g;
                        best_slot = s;
                        best_b = b;
                        best_n = ln;
                        best_s = ls;
                        best_tn = tn;
                        first = 0;
                        if (isnan(g)) {
                            found_nan = 1;
                            break;
                        }
                    }
                }
            }
            gain[e] = best;
            slot[e] = best_slot;
            index[e] = best_b;
            left[2 * e] = best_n;
            left[2 * e + 1] = best_s;
            more_left[e] = best_n > best_tn - best_n;
        }
    }
    Py_END_ALLOW_THREADS
done:
    return finish(v, got, Py_NewRef(Py_None));
}
