import numpy as np

def pooled_rows(points: np.ndarray, weights: np.ndarray, out: np.ndarray, R: int, K: int,
                P: int, n_bins: int, /) -> None: ...
def sketch_positions(weights: np.ndarray, start: np.ndarray, end: np.ndarray,
                     wanted: np.ndarray, pos: np.ndarray, slot: np.ndarray, n_points: int,
                     r: int, /) -> int: ...
def histogram_sums(bc: np.ndarray, w: np.ndarray, rows: np.ndarray, row_of: np.ndarray,
                   feat: np.ndarray, uniq_off: np.ndarray, uniq_all: np.ndarray,
                   missing: np.ndarray, thr: np.ndarray, y: np.ndarray, out: np.ndarray,
                   cbits: int, S: int, mode: int, /) -> None: ...
def grid_sums(node: np.ndarray, row: np.ndarray, weight: np.ndarray, pos: np.ndarray,
              feats: np.ndarray, thr: np.ndarray, uniq_off: np.ndarray, uniq_all: np.ndarray,
              codes: np.ndarray, y: np.ndarray, out: np.ndarray, n_rows: int, m: int, S: int,
              mode: int, has_missing: int, missing_bin: int, /) -> None: ...
