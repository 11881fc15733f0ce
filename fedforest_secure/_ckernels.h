/* Shared declarations of the compiled loops (_ckernels.c and the _ckernels_*.c files). */
#ifndef FEDFOREST_CKERNELS_H
#define FEDFOREST_CKERNELS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* the largest sketch size, number of statistics or of bins a call takes */
#define MAX_WIDTH ((Py_ssize_t)1 << 24)

/* a < b with NaN after every number (numpy's sort order) */
static inline int lt_nan_last(double a, double b)
{
    if (isnan(a))
        return 0;
    if (isnan(b))
        return 1;
    return a < b;
}

/* numpy's clip(t, lo, hi) for doubles: maximum then minimum, NaN propagated */
static inline double clip(double t, double lo, double hi)
{
    double m = isnan(t) ? t : (t > lo ? t : lo);
    return isnan(m) ? m : (m < hi ? m : hi);
}

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

/* helpers of _ckernels.c: buffers, sizes and fields */
int get_buffer(PyObject *obj, Py_buffer *view, const char *fmt, int writable, const char *name);
int get_buffers(PyObject **o, Py_buffer *v, const char *const *fmt, const char *const *name,
                int n, int writable, int *got);
PyObject *finish(Py_buffer *v, int n, PyObject *result);
int bytes_eq(Py_ssize_t len, Py_ssize_t a, Py_ssize_t b, Py_ssize_t c);
int bytes_at_least(Py_ssize_t len, Py_ssize_t a, Py_ssize_t b);
int layout_of(const field *code, const field *row, const field *w);
const char *native_format(PyObject *obj, Py_buffer *view);
int get_i32(PyObject *obj, Py_buffer *view, const char *name);
int get_field(PyObject *obj, Py_buffer *view, Py_ssize_t shift, unsigned long long mask,
              field *f, const char *name);

/* the module's functions (_ckernels_sketch.c, _ckernels_order.c, _ckernels_stats.c,
 * _ckernels_pack.c, _ckernels_split.c, _ckernels_pairs.c) */
PyObject *pooled_rows(PyObject *self, PyObject *args);
PyObject *pooled_lists(PyObject *self, PyObject *args);
PyObject *list_lengths(PyObject *self, PyObject *args);
PyObject *best_moments(PyObject *self, PyObject *args);
PyObject *sketch_values(PyObject *self, PyObject *args);
PyObject *order_keys(PyObject *self, PyObject *args);
PyObject *sorted_keys(PyObject *self, PyObject *args);
PyObject *histogram_blocks(PyObject *self, PyObject *args);
PyObject *grid_sums(PyObject *self, PyObject *args);
PyObject *marginal_at(PyObject *self, PyObject *args);
PyObject *grid_picks(PyObject *self, PyObject *args);
PyObject *encode_values(PyObject *self, PyObject *args);
PyObject *pack_cells(PyObject *self, PyObject *args);
PyObject *route_pairs(PyObject *self, PyObject *args);
PyObject *node_totals(PyObject *self, PyObject *args);

#endif
