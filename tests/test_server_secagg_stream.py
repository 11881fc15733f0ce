"""The streaming (accumulate) mode of SecAggServer: same sums, no per-client vectors kept."""

from __future__ import annotations

import numpy as np
import pytest

from fedforest_secure.errors import AbortedRound
from fedforest_secure.secagg import InProcessSecureSum, SecAggServer


def _vectors(k: int, n: int, seed: int) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {u: rng.integers(0, 2**63, n, dtype=np.uint64) for u in range(k)}


@pytest.mark.parametrize("streaming", [False, True])
def test_streaming_sum_with_dropouts_equals_plain_sum(streaming: bool) -> None:
    vecs = _vectors(6, 257, 1)
    agg = InProcessSecureSum(range(6), threshold=0.67, job_id="j", streaming=streaming)
    total = agg.sum("q0", b"\x01" * 32, vecs, drop_after_sharing=[2])
    want = np.zeros(257, dtype=np.uint64)
    for u in (0, 1, 3, 4, 5):
        want += vecs[u]
    assert np.array_equal(total, want)
    # second round: keys rode along on the unmask responses
    vecs2 = _vectors(6, 257, 2)
    total2 = agg.sum("q1", b"\x02" * 32, vecs2, drop_after_upload=[5])
    assert np.array_equal(total2, sum(vecs2.values(), np.zeros(257, dtype=np.uint64)))


def test_streaming_server_keeps_no_vectors() -> None:
    agg = InProcessSecureSum(range(4), threshold=0.75, job_id="j", streaming=True)
    seen: list[int] = []
    server_cls_receive = SecAggServer.receive_upload

    def spy(self: SecAggServer, header, vector) -> None:  # type: ignore[no-untyped-def]
        server_cls_receive(self, header, vector)
        seen.append(sum(int(v.size) for v in self._uploads.values()))

    SecAggServer.receive_upload = spy  # type: ignore[method-assign]
    try:
        agg.sum("q", b"\x03" * 32, _vectors(4, 100, 3))
    finally:
        SecAggServer.receive_upload = server_cls_receive  # type: ignore[method-assign]
    assert seen == [0, 0, 0, 0]
    assert agg.last_server is not None and agg.last_server.streaming


def test_streaming_abort_releases_nothing() -> None:
    agg = InProcessSecureSum(range(4), threshold=0.75, job_id="j", streaming=True)
    with pytest.raises(AbortedRound):
        agg.sum("q", b"\x04" * 32, _vectors(4, 10, 4), drop_after_sharing=[0, 1])
    assert agg.last_server is not None and agg.last_server._running is None
