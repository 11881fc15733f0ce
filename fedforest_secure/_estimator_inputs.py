"""What the estimators refuse in their inputs before any training, each naming the column
or argument and the remedy: dates and durations, repeated column names, text weights, a site
whose rows all weigh 0, unsigned class labels beyond int64, and a regression target too large or
of too small a spread for the trees' sums of squares; and the inputs' value bounds, with a
warning where the secure sketch cannot resolve a feature's values within them."""

from __future__ import annotations

import datetime as dt
import warnings
from collections import Counter
from typing import Any

import numpy as np

from ._secure_cdf import MIN_CELL
from .errors import SchemaError

__all__ = ["as_schema_error", "name_text_cell", "nan_bounds", "refuse_complex", "refuse_dates",
           "refuse_duplicate_names", "refuse_huge_target", "refuse_text_weights",
           "refuse_tiny_target", "refuse_weightless_sites", "target_centre",
           "warn_unresolved_target"]

#: the least scale of a regression target in the fixed-point ring (``target_bound`` of a job):
#: a target of smaller spread is encoded in units of this scale
TARGET_BOUND_FLOOR = 1e-12


def as_schema_error(check: Any, *args: Any, **kwargs: Any) -> Any:
    """``check(*args, **kwargs)`` with its ValueError raised as :class:`SchemaError` (also a
    ValueError, with the same message)."""
    try:
        return check(*args, **kwargs)
    except SchemaError:
        raise
    except ValueError as exc:
        raise SchemaError(str(exc)) from exc


def name_text_cell(X: Any) -> None:
    """Refuse a table's first text cell that is not a number (``'130 mmHg'``) naming its column
    and 1-based row, as predict does (scikit-learn's "could not convert string to float" names
    neither); nothing for an array or a table without one."""
    dtypes: Any = getattr(X, "dtypes", None)
    iloc = getattr(X, "iloc", None)
    if isinstance(X, np.ndarray) or iloc is None or not hasattr(dtypes, "items"):
        return
    for j, (name, dtype) in enumerate(dtypes.items()):
        if getattr(dtype, "kind", "O") in "biufc":
            continue
        for i, v in enumerate(iloc[:, j].tolist(), start=1):
            if not isinstance(v, str | bytes):
                continue
            try:
                float(v)
            except ValueError:
                raise SchemaError(f"column {str(name)!r}, row {i}: {v!r} is not a "
                                  "number") from None


#: what an object column may hold that is a date, a time of day or a duration
_TIME_TYPES = (dt.date, dt.time, dt.timedelta, np.datetime64, np.timedelta64)


def refuse_dates(X: Any) -> None:
    """Refuse a table's date, time or duration column by name (datetime64 and timedelta64
    columns, and object columns holding ``datetime`` or numpy date objects): scikit-learn's
    forests cannot read one as numbers, nor can these (numpy's error names neither the
    column nor a remedy)."""
    columns: list[tuple[str, Any, Any]]  # what, dtype, how to get its cells
    if isinstance(X, np.ndarray):
        columns = [("X", X.dtype, lambda: X)]
    else:
        dtypes: Any = getattr(X, "dtypes", None)
        iloc = getattr(X, "iloc", None)
        columns = [(f"column {str(name)!r}", dtype,
                    None if iloc is None else (lambda j=j: iloc[:, j]))
                   for j, (name, dtype) in enumerate(dtypes.items())] \
            if hasattr(dtypes, "items") else []
    for what, dtype, cells in columns:
        kind = getattr(dtype, "kind", "")
        shown = str(dtype)
        if kind == "O" and cells is not None:  # Python dates, times or durations as objects
            when = next((v for v in np.asarray(cells(), dtype=object).ravel().tolist()
                         if isinstance(v, _TIME_TYPES)), None)
            if when is None:
                continue
            kind = ("m" if isinstance(when, dt.timedelta | np.timedelta64)
                    else "t" if isinstance(when, dt.time) else "M")
            shown = f"{type(when).__module__.split('.')[0]}.{type(when).__name__} values"
        if kind in ("M", "m", "t"):
            held, how = {"M": ("dates", "days since a reference date"),
                         "m": ("durations", "a number of days or seconds"),
                         "t": ("times of day", "hours since midnight")}[kind]
            raise SchemaError(f"{what} holds {held} ({shown}): the forest reads numbers only; "
                              f"convert it, e.g. to {how}, before fit and predict")


def _huge_limit(rows: float) -> float:
    """The largest centred target whose sums of squares over ``rows`` rows stay finite
    (:func:`refuse_huge_target`)."""
    return float(np.sqrt(np.finfo(np.float64).max)) / (2.0 * max(rows, 1.0))


def _weighted_median(y: np.ndarray, weights: np.ndarray | None) -> float:
    """The median of ``y`` with each row repeated its (whole) weight times: the value
    ``np.median`` takes of the repeated rows, bit for bit."""
    if weights is None:
        return float(np.median(y))
    order = np.argsort(y, kind="stable")
    ends = np.cumsum(weights[order])  # the repeated rows y[order[i]] fill [ends[i-1], ends[i])
    total = int(ends[-1])
    at = np.searchsorted(ends, [(total - 1) // 2, total // 2], side="right")
    return float(np.median(y[order[at]]))


def target_centre(y: np.ndarray, weights: np.ndarray | None, middle: float, rows: float,
                  plain_sums: bool) -> float:
    """The value a regression target ``y`` (the rows kept, of frequency ``weights`` or None)
    is centred on before the sums of y and y^2 the trees grow from are taken.

    A node's ``n * Var`` comes from those sums within about ``PURE_TOLERANCE * sum y^2``
    (:data:`~fedforest_secure._leaves.PURE_TOLERANCE`), so rows far from the centre hide the
    spread of their nodes. With plain float sums (``plain_sums``: no fixed-point ring, no DP
    noise) the centre is the median of y (each row counted its weight times, as the rows it
    stands for would be): the bulk of the rows sits at 0 whatever far values a
    few rows hold, and the trees split the bulk as on the raw target (a single y of 1e8 beside
    y ~ 100 +- 10 left stumps when centred on the middle of the range). Otherwise, or when
    the median would put a row beyond what the sums of squares hold (:func:`_huge_limit`), it
    is ``middle``, the middle of y's range: the half-width it leaves is the fixed-point
    ring's scale and the DP noise's bound, both smallest there.
    """
    if not plain_sums or y.size == 0:
        return middle
    median = _weighted_median(y, weights)
    if max(float(y.max()) - median, median - float(y.min())) > _huge_limit(rows):
        return middle
    return median


def warn_unresolved_target(name: Any, y: np.ndarray, centre: float, bound: float,
                           frac_bits: int | None) -> None:
    """Warn (UserWarning) where the trees cannot resolve the spread of the bulk of the target
    ``y`` (the rows kept, before centring) about ``centre``: the middle half of y (its
    interquartile range, as a standard deviation) is below ten times the spread that the
    purity test takes for rounding at the bulk's distance from the centre
    (``sqrt(PURE_TOLERANCE) * |median - centre|``), or, in a fixed-point ring of ``frac_bits``
    with scale ``bound``, its variance spans fewer than 4 of the ring's units of y^2. A far
    value (a sentinel) under a secure or DP profile, whose centre is the middle of the range,
    does it; the nodes of the bulk then stop splitting."""
    from ._leaves import PURE_TOLERANCE

    if y.size < 2:
        return
    q1, median, q3 = (float(q) for q in np.percentile(y, [25.0, 50.0, 75.0]))
    sd = (q3 - q1) / 1.349  # the standard deviation of a normal bulk of that middle half
    if sd <= 0.0:
        return  # most rows share one value: the bulk's nodes are pure
    floor = float(np.sqrt(PURE_TOLERANCE)) * abs(median - centre)
    ring = bound * float(np.sqrt(4.0 * 2.0 ** -frac_bits)) if frac_bits is not None else 0.0
    if sd >= 10.0 * floor and sd >= ring:
        return
    what = "y" if name is None else f"y ({str(name)!r})"
    warnings.warn(
        f"{what}: the middle half of its values spreads about {sd:.3g} (as a standard "
        f"deviation) around {median:.6g}, but the trees' sums of y and y^2 are taken about "
        f"{centre:.6g}, the middle of its range [{float(y.min()):.6g}, {float(y.max()):.6g}], "
        f"and resolve only a spread of about {max(floor, ring):.3g} there: nodes of the bulk "
        "stop splitting and the forest comes out shallow. Correct or drop the far values of "
        "y, or rescale it (e.g. a log)", UserWarning, stacklevel=4)  # the line calling fit


def refuse_huge_target(name: Any, largest: float, middle: float, rows: float) -> None:
    """Refuse a centred regression target whose sums of squares could overflow float64.

    The trees grow from each node's sums of y and y^2 (``_impurity``): over ``rows`` rows
    (frequency weights counted) the square of the sum reaches ``(rows * largest)^2``, so
    ``largest`` must stay within ``sqrt(float64 max) / (2 * rows)`` (half of it: the sums of
    two children and the noise of a DP profile add to a node's). Beyond it every tree came
    out a single leaf, or the secure aggregate non-finite.
    """
    limit = _huge_limit(rows)
    if largest <= limit:
        return
    what = "y" if name is None else f"y ({str(name)!r})"
    factor = 10.0 ** int(np.floor(np.log10(largest)))  # to values of order 1
    raise SchemaError(f"{what} lies up to {largest:.3g} from the middle of its range "
                      f"({middle:.3g}): the sums of squares of y over {rows:.0f} rows that the "
                      f"trees grow from would overflow float64, which keeps them finite only "
                      f"within {limit:.3g} of the middle; rescale the target (e.g. divide it "
                      f"by {factor:.0e}) and multiply the predictions back")


def refuse_tiny_target(name: Any, largest: float, middle: float, frac_bits: int | None
                       ) -> None:
    """Refuse a centred regression target of nonzero spread too small for the trees' sums.

    In float64 (every profile) the squares of y must stay normal numbers with their full
    precision: ``largest^2 * 2^-52`` at least the smallest normal float64, so ``largest`` at
    least ``sqrt(tiny / eps)`` (about 1e-146; below about 1e-155 every tree came out a single
    leaf). In a fixed-point ring (``frac_bits``, secure profiles) y^2 is encoded in units of
    ``TARGET_BOUND_FLOOR^2 * 2^-frac_bits``: ``largest`` must be at least
    ``TARGET_BOUND_FLOOR * 2^-(frac_bits / 3)`` (3.9e-15 at 24 bits), so the largest row's y^2
    still spans ``2^(frac_bits / 3)`` units (at 1e-15, 17 units, the trees still grew; they
    shrank at 3e-16 and were single leaves below about 3e-17). A constant target
    (``largest == 0``) is allowed.
    """
    fi = np.finfo(np.float64)
    limit = float(np.sqrt(fi.tiny / fi.eps))
    if frac_bits is not None:
        limit = max(limit, TARGET_BOUND_FLOOR * 2.0 ** (-frac_bits / 3))
    if largest == 0 or largest >= limit:
        return
    what = "y" if name is None else f"y ({str(name)!r})"
    factor = 10.0 ** -int(np.floor(np.log10(largest)))  # to values of order 1
    where = ("the fixed-point encoding of secure aggregation resolves" if frac_bits is not None
             and limit > float(np.sqrt(fi.tiny / fi.eps)) else "float64 keeps")
    raise SchemaError(f"{what} lies at most {largest:.3g} from the middle of its range "
                      f"({middle:.3g}): the sums of squares of y that the trees grow from "
                      f"would round to nothing ({where} a spread of {limit:.3g} or more), and "
                      f"every tree would be a single leaf; rescale the target (e.g. multiply it "
                      f"by {factor:.0e}) and divide the predictions back")


def refuse_complex(X: Any) -> None:
    """Refuse a table ``X`` with a complex column or cell in scikit-learn's words
    (``check_array``'s), at fit and at predict alike: a complex cell of an object column (or of
    an object array) failed with a bare TypeError, and predict took a complex column's real part.

    Only what can hold a complex value is read: a complex column, the cells of an object column
    or array one column at a time (no copy of the table), a categorical column's categories;
    numbers, text (``str``) and bool columns are skipped. Other inputs (complex arrays, lists,
    sparse matrices) are left to ``check_array``, which refuses complex values itself.

    Raises
    ------
    SchemaError
        ``Complex data not supported`` and the table.
    """
    if isinstance(X, np.ndarray):
        if X.dtype == object and _holds_complex(X.ravel()):
            raise SchemaError(f"Complex data not supported\n{X}\n")
        return
    dtypes = getattr(X, "dtypes", None)
    if dtypes is None:
        return
    iloc = getattr(X, "iloc", None)
    single = not hasattr(dtypes, "__iter__")  # a Series: one dtype, itself the column
    for j, dtype in enumerate([dtypes] if single else list(dtypes)):
        if getattr(dtype, "kind", None) == "c":
            found = True
        elif isinstance(dtype, np.dtype) and dtype.kind == "O":
            col = X if single else (iloc[:, j] if iloc is not None else None)
            found = col is not None and _holds_complex(np.asarray(col))
        else:
            categories = getattr(dtype, "categories", None)
            found = categories is not None and (
                getattr(categories.dtype, "kind", None) == "c"
                or (categories.dtype == object and _holds_complex(np.asarray(categories))))
        if found:
            raise SchemaError(f"Complex data not supported\n{X}\n")


def _holds_complex(values: np.ndarray) -> bool:
    """Whether a 1-d object array holds a complex number (Python's or NumPy's)."""
    return any(issubclass(t, complex | np.complexfloating) for t in set(map(type, values)))


def refuse_duplicate_names(X: Any) -> None:
    """Refuse a table whose column names (strings: scikit-learn's feature names) repeat:
    predict takes a table's columns by name, so a repeated one could never be predicted on."""
    cols = getattr(X, "columns", None)
    if cols is None or isinstance(X, np.ndarray):
        return
    names = list(cols)
    if not names or not all(isinstance(c, str) for c in names):
        return
    twice = sorted(c for c, k in Counter(names).items() if k > 1)
    if twice:
        raise SchemaError(f"duplicate column name{'s' if len(twice) > 1 else ''} "
                          f"{', '.join(map(repr, twice))}: predict takes the columns by name, "
                          "so each must appear once; rename or drop the repeated columns "
                          "(pd.concat of tables that share a column repeats it)")


def refuse_text_weights(sample_weight: Any) -> None:
    """Refuse sample_weight holding text that is not a number: site names passed as fit's
    third positional argument, where ``client=`` was meant."""
    arr = np.asarray(sample_weight)
    if arr.dtype.kind not in "OSU":
        return

    def not_a_number(v: object) -> bool:
        if not isinstance(v, str | bytes):
            return False
        try:  # "2" is a weight, as scikit-learn reads it
            float(v)
        except ValueError:
            return True
        return False

    text = next((v for v in arr.ravel().tolist() if not_a_number(v)), None)
    if text is not None:
        raise SchemaError(f"sample_weight holds text ({text!r}), not frequency weights: "
                          "sample_weight is fit's third positional argument; pass the sites "
                          "as client=, e.g. fit(X, y, client=sites)")


def refuse_wide_int_labels(classes: np.ndarray) -> None:
    """Refuse unsigned integer class labels beyond int64 (2^63 and more): a model file reads
    integer labels back as int64 numbers (a larger one would come back as a rounded float) and ONNX
    holds them as int64. (scikit-learn's target checks refuse Python ints held as objects.)"""
    if classes.dtype.kind != "u" or not classes.size or classes.max() <= _INT64_MAX:
        return
    raise SchemaError(f"class label {int(classes.max())} is outside the range of 64-bit signed "
                      "integers (-2^63 to 2^63 - 1): the model file and ONNX keep integer "
                      "labels as int64, and this one would not come back exact; map the "
                      "classes to smaller integers or to text (e.g. y.astype(str)) before fit")


_INT64_MAX = int(np.iinfo(np.int64).max)


def refuse_weightless_sites(clients: np.ndarray, codes: np.ndarray, kept: np.ndarray) -> None:
    """Refuse sites (``clients[k]``, the labels of ``client=``) none of whose rows (``codes ==
    k``) is ``kept`` (of positive sample_weight): each site trains on its own rows, so one
    without any has nothing to send."""
    rows = np.bincount(codes, minlength=len(clients))
    weighed = np.bincount(codes[kept], minlength=len(clients))
    empty = np.flatnonzero(weighed == 0)
    if not empty.size:
        return
    labels = clients.tolist()
    shown = ", ".join(repr(labels[k]) for k in empty[:10]) + (", ..." if empty.size > 10 else "")
    one = empty.size == 1
    counted = f"its {rows[empty[0]]} rows weigh 0" if one else "all their rows weigh 0"
    raise SchemaError(f"client{'' if one else 's'} {shown} ha{'s' if one else 've'} no row of "
                      f"positive sample_weight ({counted}): a site needs at least one row to "
                      f"train on; drop {'its' if one else 'their'} rows from X, y, sample_weight "
                      f"and client, or give some of them a positive weight")


def warn_unresolved(X: np.ndarray, lo: np.ndarray, hi: np.ndarray, names: Any) -> None:
    """Warn (UserWarning), per feature, where the secure pooled-CDF sketch cannot tell the
    data's bulk apart within the bounds ``[lo, hi]`` the estimator took from ``X``: the middle
    half of the feature's distinct values (its interquartile range; distinct values, so that a
    value most rows share is no narrow bulk) spans less than
    :data:`~fedforest_secure._secure_cdf.MIN_CELL` of the bounds' width, the narrowest cell
    the sketch cuts (one far value, 1e20 beside data of spread 10, does it). ``names``: the
    columns' names, or None."""
    for j in range(X.shape[1]):
        col = X[:, j]
        distinct = np.unique(col[~np.isnan(col)])
        if distinct.size < 2:
            continue
        q1, q3 = np.percentile(distinct, [25.0, 75.0])
        width = 2.0 * (float(hi[j]) * 0.5 - float(lo[j]) * 0.5)  # inf beyond the float range
        if q3 - q1 >= MIN_CELL * width:
            continue
        what = f"feature {j}" if names is None else f"feature {str(names[j])!r}"
        warnings.warn(
            f"{what}: the middle half of its distinct values spans {q3 - q1:.3g}, less than "
            f"{MIN_CELL:g} of its range [{float(lo[j]):.6g}, {float(hi[j]):.6g}] (its smallest "
            "and largest values, the bounds of the secure sketch); the sketch cuts no finer, "
            "so the forest may split on this feature rarely or never. Clip the far values to "
            "the feature's plausible range (np.clip), transform the feature (e.g. a log), or "
            "drop the rows that hold them", UserWarning, stacklevel=4)  # the line calling fit


def nan_bounds(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature [lo, hi] of the present (non-NaN) values, lo < hi: a column without two
    distinct present values gets a unit range."""
    present = ~np.isnan(X)
    lo = np.where(present, X, np.inf).min(axis=0, initial=np.inf)
    hi = np.where(present, X, -np.inf).max(axis=0, initial=-np.inf)
    lo = np.where(np.isfinite(lo), lo, 0.0)
    hi = np.where(np.isfinite(hi) & (hi > lo), hi, lo + 1.0)
    return lo, hi
