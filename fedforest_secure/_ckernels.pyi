import numpy as np

def pooled_rows(points: np.ndarray, weights: np.ndarray, out: np.ndarray, R: int, K: int,
                P: int, n_bins: int, /) -> None: ...
def sketch_positions(weights: np.ndarray, start: np.ndarray, end: np.ndarray,
                     wanted: np.ndarray, out: np.ndarray, n_points: int, r: int, /) -> None: ...
def histogram_sums(bc: np.ndarray, w: np.ndarray, rows: np.ndarray, row_of: np.ndarray,
                   feat: np.ndarray, uniq_off: np.ndarray, uniq_all: np.ndarray,
                   missing: np.ndarray, thr: np.ndarray, y: np.ndarray, out: np.ndarray,
                   cbits: int, S: int, mode: int, /) -> None: ...
