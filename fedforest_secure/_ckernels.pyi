import numpy as np

def pooled_rows(points: np.ndarray, weights: np.ndarray, out: np.ndarray, R: int, K: int,
                P: int, n_bins: int, /) -> None: ...
def sketch_values(weights: np.ndarray, weight_shift: int, weight_mask: int, codes: np.ndarray,
                  code_shift: int, code_mask: int, edges: np.ndarray, wanted: np.ndarray,
                  feat: np.ndarray, uniq_off: np.ndarray, uniq_all: np.ndarray,
                  missing: np.ndarray, out: np.ndarray, n_points: int, r: int, /) -> None: ...
def histogram_blocks(codes: np.ndarray, code_shift: int, code_mask: int, rows: np.ndarray,
                     row_shift: int, row_mask: int, weights: np.ndarray, weight_shift: int,
                     weight_mask: int, edges: np.ndarray, blocks: np.ndarray,
                     feat: np.ndarray, uniq_off: np.ndarray, uniq_all: np.ndarray,
                     missing: np.ndarray, thr: np.ndarray, y: np.ndarray, out: np.ndarray,
                     S: int, mode: int, /) -> None: ...
def grid_sums(node: np.ndarray, row: np.ndarray, weight: np.ndarray, pos: np.ndarray,
              feats: np.ndarray, thr: np.ndarray, uniq_off: np.ndarray, uniq_all: np.ndarray,
              codes: np.ndarray, y: np.ndarray, out: np.ndarray, n_rows: int, m: int, S: int,
              mode: int, has_missing: int, missing_bin: int, /) -> None: ...
def marginal_at(xs: np.ndarray, cdf: np.ndarray, feats: np.ndarray, values: np.ndarray,
                out: np.ndarray, L: int, mode: int, /) -> None: ...
def grid_picks(rows: np.ndarray, counts: np.ndarray, total: np.ndarray, edges: np.ndarray,
               bnu: np.ndarray, pick: np.ndarray, B: int, W: int, /) -> None: ...
def encode_values(values: np.ndarray, divisor: np.ndarray, factor: np.ndarray,
                  limit: np.ndarray, out: np.ndarray, /) -> int: ...
def order_keys(node: np.ndarray, row: np.ndarray, weight: np.ndarray, codes: np.ndarray,
               fstart: np.ndarray, unused: np.ndarray, keys: np.ndarray, m: int, shift: int,
               hi: int, packed: int, /) -> int: ...
