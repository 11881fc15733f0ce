"""The level order: every (pair, feature slot) of one client's level, sorted by (block, code).

A *block* is one (node, feature slot) of the level; a *pair* is one (tree, row) with a non-zero
bootstrap multiplicity. Sorted by block and then by the row's exact integer code of the slot's
feature, every block is a contiguous run in which the client's values ascend, so the quantile
sketch is a look-up and every histogram bin a contiguous segment.

When the fields fit in 62 bits, one int64 key per entry carries them all, packed as
``block | code | row | weight`` (weight in the low 8 bits): the order is that array sorted, and
nothing has to be gathered through a permutation afterwards. The compiled loops write its keys
in ascending order block by block (``sorted_keys``: each feature's rows ranked by code once,
each block's pairs put in their rows' rank order); numpy builds every key and sorts them
(the same array). Otherwise (huge levels, a client with more than about a million rows,
multiplicities of 256 or more) the key is ``block | code`` and rows and weights are kept
beside it, in the same order.
"""

from __future__ import annotations

import numpy as np

from . import _kernels

__all__ = ["LevelOrder", "first_reaching"]

_SENTINEL = np.iinfo(np.int64).max  # key of an unused slot: sorts after every real entry
#: entries per chunk of the per-block passes (sketch, histogram): bounds their scratch memory
CHUNK_ENTRIES = 1 << 18
#: first_reaching searches (instead of building its table) when the targets number less than
#: 1 / SEARCH_FACTOR of the total weight (a search of ascending targets costs a few table
#: entries each)
SEARCH_FACTOR = 8


class LevelOrder:
    """One level's sorted entries (see the module docstring).

    Parameters
    ----------
    feats : (n_nodes, m) feature of every (node, slot); -1 marks an unused slot
    node, row, weight : the level's pairs (node index, row index, bootstrap multiplicity)
    codes : feature-major exact codes, the code of (feature j, row i) at ``j * n_rows + i``
    n_rows : the client's number of rows
    cbits : bits of a code (codes lie in ``[0, 2**cbits)``)
    """

    def __init__(self, feats: np.ndarray, node: np.ndarray, row: np.ndarray,
                 weight: np.ndarray, codes: np.ndarray, n_rows: int, cbits: int) -> None:
        n_nodes, m = feats.shape
        self.feats = feats.copy()
        self.cbits = cbits
        P = node.size
        # row index (at least 16 bits) above an 8-bit weight
        rbits = max(int(n_rows).bit_length(), 16) + 8
        wmax = int(weight.max()) if P else 0
        blk_bits = int(max(n_nodes * m, 1)).bit_length()
        self.packed = wmax < 256 and blk_bits + cbits + rbits <= 62
        self.shift = rbits if self.packed else 0
        self._rows: np.ndarray | None = None
        self._w: np.ndarray | None = None
        self._code: np.ndarray | None = None  # compact form (see compact())
        self._edges: np.ndarray | None = None
        self._block_starts: np.ndarray | None = None  # cache of all_edges()
        # each node's pairs: a block (node, used slot) holds one entry per pair of its node
        self._node_pairs = np.bincount(node, minlength=n_nodes)
        self.key: np.ndarray | None
        self._rmask = (1 << (rbits - 8)) - 1
        node64 = node.astype(np.int64)
        row64 = row.astype(np.int64)
        hi = cbits + self.shift  # where the block field starts
        if self.packed and _kernels.KERNELS is not None and codes.dtype == np.int32:
            # the same keys in ascending order, written in place by a counting pass
            self.key = np.empty(int(self.all_edges()[-1]), dtype=np.int64)
            written = _kernels.KERNELS.sorted_keys(
                _kernels.i64(node64), _kernels.i64(row64), _kernels.i64(weight),
                np.ascontiguousarray(codes), _kernels.i64(feats), self.key, n_rows, m,
                self.shift, hi)
            if written != self.key.size:
                raise RuntimeError(f"sorted_keys wrote {written} keys of {self.key.size}")
            return
        keys = np.empty((m, P), dtype=np.int64)  # slot-major: each slot's pass stays in cache
        # per node and slot: where the slot's feature's codes start (unused slots: feature 0)
        fstart = np.maximum(feats, 0).astype(np.int64) * n_rows
        if _kernels.KERNELS is not None and codes.dtype == np.int32:  # the same keys, one pass
            n_unused = _kernels.KERNELS.order_keys(
                _kernels.i64(node64), _kernels.i64(row64), _kernels.i64(weight),
                np.ascontiguousarray(codes), _kernels.i64(fstart), _kernels.i64(feats < 0),
                keys, m, self.shift, hi, int(self.packed))
        else:
            n_unused = self._keys_numpy(keys, feats, node, node64, row64, weight, codes,
                                        fstart, hi)
        flat = keys.reshape(-1)
        if self.packed:
            # keys below 2^62 read as doubles are positive and ordered alike (the sentinel
            # reads as NaN, which sorts last): numpy's vectorised float sort is the faster
            flat.view(np.float64).sort()
            self.key = flat[: flat.size - n_unused] if n_unused else flat
        else:  # block|code key with rows and weights carried through a permutation
            order = np.argsort(flat, kind="stable")
            if n_unused:
                order = order[: order.size - n_unused]
            self.key = flat[order]
            self._rows = np.tile(row64, m)[order]
            self._w = np.tile(weight.astype(np.int64), m)[order]

    def _keys_numpy(self, keys: np.ndarray, feats: np.ndarray, node: np.ndarray,
                    node64: np.ndarray, row64: np.ndarray, weight: np.ndarray,
                    codes: np.ndarray, fstart: np.ndarray, hi: int) -> int:
        """The keys of every slot into ``keys`` (m, P) with numpy; returns the unused ones'
        number (their keys are the sentinel)."""
        n_nodes, m = feats.shape
        P = node.size
        if self.packed:
            base = node64 * m
            base <<= hi
            base |= row64 << 8
            base |= weight.astype(np.int64)
        else:
            base = (node64 * m) << hi
        n_unused = 0
        slot_unused = np.asarray((feats < 0).any(axis=0))
        # pairs in node order (a node group's pairs always are): a slot's per-node values
        # are repeated over the node's run of pairs instead of gathered pair by pair
        runs = np.bincount(node, minlength=n_nodes) \
            if P > 1 and not (node[1:] < node[:-1]).any() else None
        for s in range(m):
            # per pair: start of its slot feature's codes
            f = np.repeat(fstart[:, s], runs) if runs is not None else fstart[:, s][node]
            f += row64
            out = keys[s]
            out[...] = codes[f]  # int32 codes, widened on store (indexing: faster than take)
            del f
            out <<= self.shift
            out |= base
            out += s << hi
            if slot_unused[s]:
                unused = (feats[:, s] < 0)[node]
                out[unused] = _SENTINEL
                n_unused += int(unused.sum())
        return n_unused

    @property
    def size(self) -> int:
        if self.key is not None:
            return int(self.key.size)
        if self._edges is None:  # pragma: no cover - a compact order keeps its edges
            raise ValueError("a level order holds either keys or block edges")
        return int(self._edges[-1])

    def compact(self) -> None:
        """Keep the order in 5 bytes per entry instead of 8 until the level's next round.

        Between the sketch and the histogram round only codes, rows, weights and block
        boundaries are needed; the packed key is rebuilt a chunk at a time by :meth:`search`.
        Only for packed keys whose code and row fields are exactly 16 bits wide (clients
        with fewer than 65,536 rows, the common case); otherwise a no-op.
        """
        if self.key is None or not self.packed or self.cbits != 16 or self.shift != 24:
            return
        self._edges = self.all_edges()
        # 16-bit fields: a narrowing cast keeps exactly the field, no mask needed
        self._code = (self.key >> self.shift).astype(np.uint16)
        self._rows = (self.key >> 8).astype(np.uint16)
        self._w = self.key.astype(np.uint8)
        self.key = None

    def _chunk_key(self, lo: int, hi: int) -> np.ndarray:
        """(block << cbits | code) of entries ``[lo, hi)`` from the compact form."""
        if self._edges is None or self._code is None:
            raise RuntimeError("internal: the level order has neither keys nor compact codes")
        edges = self._edges
        first = int(np.searchsorted(edges, lo, side="right")) - 1
        inner = edges[(edges > lo) & (edges < hi)] - lo
        blk = np.bincount(inner, minlength=hi - lo)[: hi - lo]
        np.cumsum(blk, out=blk)
        blk += first
        blk <<= self.cbits
        blk |= self._code[lo:hi]
        return blk

    def all_edges(self) -> np.ndarray:
        """Where every block starts (``out[i]``), and the end of the last (``out[-1]``): the
        blocks' sizes added up in block order, a block of a used slot holding one entry per
        pair of its node and one of an unused slot none."""
        if self._block_starts is None:
            sizes = (self._node_pairs[:, None] * (self.feats >= 0)).ravel()
            edges = np.zeros(sizes.size + 1, dtype=np.int64)
            np.cumsum(sizes, out=edges[1:])
            self._block_starts = edges
        return self._block_starts

    def block_edges(self, blk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Start and end position of each given block."""
        edges = self.all_edges()
        return edges[blk], edges[blk + 1]

    def search(self, block_code: np.ndarray, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Position (relative to ``lo``) of the first entry of ``[lo, hi)`` whose
        (block << cbits | code) is >= each query."""
        if self.key is None:
            return np.searchsorted(self._chunk_key(lo, self.size if hi is None else hi),
                                   block_code, side="left")
        return np.searchsorted(self.key[lo:hi], block_code << self.shift, side="left")

    def chunks(self, edges: np.ndarray, max_entries: int | None = None
               ) -> list[tuple[int, int]]:
        """Split consecutive blocks into runs of about ``max_entries`` entries.

        ``edges[i]`` is where block i starts (``edges[-1]`` the end of the last). Returns
        ``(b0, b1)`` block ranges; a block larger than the budget gets a range of its own.
        """
        if max_entries is None:
            max_entries = CHUNK_ENTRIES
        out: list[tuple[int, int]] = []
        nblk = edges.size - 1
        b0 = 0
        while b0 < nblk:
            b1 = int(np.searchsorted(edges, edges[b0] + max_entries, side="right")) - 1
            b1 = min(max(b1, b0 + 1), nblk)
            out.append((b0, b1))
            b0 = b1
        return out

    def _full_key(self) -> np.ndarray:
        """The sorted keys of an order that is not compact (:meth:`compact` keeps codes,
        rows and weights instead, and :meth:`search` rebuilds keys a chunk at a time)."""
        if self.key is None:
            raise RuntimeError("internal: the level order is compact and has no full keys")
        return self.key

    def fields(self) -> tuple[tuple[np.ndarray, int, int], ...]:
        """Where the entries' code, row and weight are kept, each as ``(array, shift, mask)``:
        entry i's value is ``(array[i] >> shift) & mask`` (a packed key holds all three)."""
        every = (1 << 64) - 1
        cmask = (1 << self.cbits) - 1
        if self.key is None:
            if self._code is None or self._rows is None or self._w is None:
                raise RuntimeError("internal: the level order has neither keys nor compact codes")
            return (self._code, 0, every), (self._rows, 0, every), (self._w, 0, every)
        if self.packed:
            return (self.key, self.shift, cmask), (self.key, 8, self._rmask), (self.key, 0, 255)
        if self._rows is None or self._w is None:  # pragma: no cover - set with unpacked keys
            raise RuntimeError("internal: an unpacked level order without rows and weights")
        return (self.key, 0, cmask), (self._rows, 0, every), (self._w, 0, every)

    def codes_at(self, idx: np.ndarray) -> np.ndarray:
        """Codes of the entries at positions ``idx``."""
        codes: np.ndarray = (self._full_key()[idx] >> self.shift) & ((1 << self.cbits) - 1)
        return codes

    def block_codes(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """(block << cbits | code) of entries ``[lo, hi)`` (every entry by default)."""
        if self.key is None:
            return self._chunk_key(lo, self.size if hi is None else hi)
        out: np.ndarray = self.key[lo:hi] >> self.shift
        return out

    def weights(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Bootstrap multiplicities of entries ``[lo, hi)`` in sorted order (integers)."""
        if self._w is not None:
            return self._w[lo:hi]
        return self._full_key()[lo:hi] & 255

    def weights_into(self, out: np.ndarray, lo: int = 0, hi: int | None = None) -> None:
        """:meth:`weights` written into ``out`` (e.g. float64), without a temporary."""
        if self._w is not None:
            out[...] = self._w[lo:hi]
            return
        np.bitwise_and(self._full_key()[lo:hi], 255, out=out, casting="unsafe")

    def rows(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Row indices of entries ``[lo, hi)`` in sorted order (integers)."""
        if self._rows is not None:
            return self._rows[lo:hi]
        out = self._full_key()[lo:hi] >> 8
        out &= self._rmask
        return out


def first_reaching(cw: np.ndarray, target: np.ndarray) -> np.ndarray:
    """For each target, the first position i with ``cw[i] >= target`` (cw: cumulative sums
    of positive integer multiplicities).

    Multiplicities are positive integers, so ``cw[i] >= t`` iff ``cw[i] >= ceil(t)``: a
    table over the integers 1..cw[-1] answers every target with one gather instead of a
    binary search. The table costs O(cw[-1]) whatever the number of targets, so few targets
    (large blocks: the top levels) are searched instead; both give the same positions for
    targets clipped to ``[1, cw[-1]]`` (targets beyond the end give the last position, as
    the table does).
    """
    total = int(cw[-1]) if cw.size else 0
    if total > 4 * max(cw.size, 1) + 1_000_000 or total >= 2**31:  # pragma: no cover
        return np.searchsorted(cw, target, side="left")
    if total == 0:
        return np.zeros(np.shape(target), dtype=np.int64)
    if SEARCH_FACTOR * np.size(target) < total:
        target = np.asarray(target)
        c = target.astype(np.int64) if target.dtype.kind in "iu" else \
            np.ceil(target).astype(np.int64)
        np.clip(c, 1, total, out=c)
        return np.searchsorted(cw, c, side="left")
    # inv[c - 1] = number of positions whose cumulative weight is below c
    marks = np.zeros(total, dtype=np.int32)
    marks[cw[:-1]] = 1
    inv = np.cumsum(marks, dtype=np.int32)
    del marks
    target = np.asarray(target)
    c = target.astype(np.int64) if target.dtype.kind in "iu" else \
        np.ceil(target).astype(np.int64)
    np.clip(c, 1, total, out=c)
    c -= 1
    out: np.ndarray = inv[c]
    return out
