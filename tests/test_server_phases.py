"""The round state machine's phase tables and the secure round's checked transitions."""

from __future__ import annotations

import numpy as np
import pytest
from test_adversarial_server import JOB, Federation, L, _task

from fedforest_secure.secagg import ServerStage
from server_app.phases import PLAIN, SECURE, Phase, PhaseError, RoundPlan, plan_for
from server_app.secagg_bridge import SecAggBridge
from server_app.secure_round import SecureRound, StoredRound


def test_the_plans_are_the_documented_chains() -> None:
    assert PLAIN.order == (Phase.UPLOAD,) and PLAIN.first is Phase.UPLOAD
    assert SECURE.order == (Phase.ADVERTISE, Phase.SHARE, Phase.UPLOAD, Phase.SIGN,
                            Phase.UNMASK)
    assert plan_for(True) is SECURE and plan_for(False) is PLAIN
    assert SECURE.after(Phase.UNMASK) is None and PLAIN.after(Phase.UPLOAD) is None


@pytest.mark.parametrize(("src", "dst"), [
    (Phase.SHARE, Phase.ADVERTISE),  # backwards
    (Phase.ADVERTISE, Phase.UPLOAD),  # skipping a phase
    (Phase.UPLOAD, None),  # closing a secure round before its unmask phase
])
def test_a_move_outside_the_table_is_refused(src: Phase, dst: Phase | None) -> None:
    with pytest.raises(PhaseError):
        SECURE.check_move(src, dst)


def test_a_plan_must_be_one_chain_and_names_only_its_phases() -> None:
    with pytest.raises(PhaseError):
        RoundPlan("cycle", {Phase.UPLOAD: Phase.UNMASK, Phase.UNMASK: Phase.UPLOAD})
    with pytest.raises(PhaseError):
        RoundPlan("two ends", {Phase.UPLOAD: None, Phase.UNMASK: None})
    with pytest.raises(PhaseError):
        PLAIN.parse("advertise")
    with pytest.raises(PhaseError):
        SECURE.parse("consistency")
    assert SECURE.parse("share") is Phase.SHARE


def _round(fed: Federation, round_id: int = 0) -> SecureRound:
    bridge = SecAggBridge(JOB, fed.threshold, directory=dict(fed.directory))
    return bridge.start(_task(round_id), list(range(fed.k)), L)


def test_a_secure_round_moves_only_along_its_table_and_yields_the_sum() -> None:
    fed = Federation()
    sr = _round(fed)
    seen = [sr.phase]
    for c in fed.clients.values():
        sr.receive(c.advertise(0))
    with pytest.raises(PhaseError):
        sr.finish()  # the sum cannot be asked for in the advertise phase
    assert sr.server.stage is ServerStage.COLLECT_ADVERTS  # ... and nothing moved
    assert not sr.missing()
    seen.append(sr.advance())
    assert sr.setup is not None
    for c in fed.clients.values():
        sr.receive(c.share_keys(sr.setup))
    seen.append(sr.advance())
    for u, c in fed.clients.items():
        sr.server.receive_upload(*c.mask(sr.deliveries[u], np.full(L, u, dtype=np.uint64)))
    seen.append(sr.advance())
    assert sr.survivor_set is not None and sr.action_for(0)[0] == "sign"
    for c in fed.clients.values():
        sr.receive(c.sign_survivors(sr.survivor_set))
    seen.append(sr.advance())
    assert sr.request is not None and sr.action_for(0)[0] == "unmask"
    for c in fed.clients.values():
        sr.receive(c.unmask(sr.request))
    with pytest.raises(PhaseError):
        sr.advance()  # the last phase closes the round; it does not advance
    assert tuple(seen + [sr.phase]) == (*SECURE.order, Phase.UNMASK)
    assert np.array_equal(sr.finish(), np.full(L, sum(range(fed.k)), dtype=np.uint64))
    assert not sr.missing() and sr.action_for(0) == ("wait", None)
    with pytest.raises(PhaseError):
        _ = sr.phase  # a finished round has no phase


def test_a_replay_stops_at_the_stored_phase() -> None:
    fed = Federation()
    adverts = {u: c.advertise(0).model_dump_json() for u, c in fed.clients.items()}
    stored = StoredRound(phase=Phase.SHARE, adverts=adverts, shares={}, uploads={}, unmask={})
    sr = _round(fed)
    sr.replay(stored)
    assert sr.phase is Phase.SHARE and sr.setup is not None
    assert sr.action_for(1) == ("share", sr.setup.model_dump_json())
