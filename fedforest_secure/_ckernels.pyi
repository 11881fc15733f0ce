import numpy as np

def pooled_rows(points: np.ndarray, weights: np.ndarray, out: np.ndarray, R: int, K: int,
                P: int, n_bins: int, /) -> None: ...
