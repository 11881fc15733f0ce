"""The states of jobs, members and rounds, and the phase tables of the two round variants.

A round is a fixed sequence of phases, each ending when every client it expects has answered
or at its deadline; the round closes after its last phase. The sequence is a transition table
(:class:`RoundPlan`), and every move the server makes is checked against it::

    plain   upload -> (closed)
    secure  advertise -> share -> upload -> sign -> unmask -> (closed)

The phase names are the strings stored in ``rounds.phase`` and sent to clients. A new phase of
the secure variant is one :class:`Phase` member, one entry in :data:`SECURE` and its operations
in :mod:`server_app.secure_round`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "PLAIN",
    "SECURE",
    "JobStatus",
    "MemberState",
    "Phase",
    "PhaseError",
    "RoundPlan",
    "RoundStatus",
    "plan_for",
]


class Phase(StrEnum):
    """One step of a round: which message the server collects from the round's clients."""

    ADVERTISE = "advertise"  # key advertisements (secure)
    SHARE = "share"  # encrypted Shamir shares (secure)
    UPLOAD = "upload"  # the summable vectors (plain) or masked vectors (secure)
    SIGN = "sign"  # the survivors' signatures on the survivor set (secure consistency step)
    UNMASK = "unmask"  # the survivors' shares that remove the masks (secure)


class JobStatus(StrEnum):
    WAITING = "waiting"  # for every invited client to join
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class MemberState(StrEnum):
    INVITED = "invited"
    ACTIVE = "active"
    DROPPED = "dropped"


class RoundStatus(StrEnum):
    OPEN = "open"
    CLOSED = "closed"


class PhaseError(RuntimeError):
    """A move the round's transition table does not allow (a server defect, never a client's)."""


@dataclass(frozen=True)
class RoundPlan:
    """A round variant: its transition table ``phase -> next phase`` (None: the round closes)."""

    name: str
    transitions: Mapping[Phase, Phase | None]

    def __post_init__(self) -> None:
        targets = [p for p in self.transitions.values() if p is not None]
        starts = [p for p in self.transitions if p not in targets]
        ends = [p for p, q in self.transitions.items() if q is None]
        if len(starts) != 1 or len(ends) != 1 or len(set(targets)) != len(targets) \
                or not set(targets) <= set(self.transitions):
            raise PhaseError(f"round plan {self.name!r} is not one chain of phases")

    @property
    def first(self) -> Phase:
        targets = set(self.transitions.values())
        return next(p for p in self.transitions if p not in targets)

    @property
    def order(self) -> tuple[Phase, ...]:
        """The phases in the order a round passes through them."""
        out: list[Phase] = []
        phase: Phase | None = self.first
        while phase is not None:
            out.append(phase)
            phase = self.transitions[phase]
        return tuple(out)

    def after(self, phase: Phase) -> Phase | None:
        """The phase that follows ``phase`` (None: the round closes after it)."""
        if phase not in self.transitions:
            raise PhaseError(f"a {self.name} round has no phase {phase.value!r}")
        return self.transitions[phase]

    def check_move(self, src: Phase, dst: Phase | None) -> None:
        """Raise :class:`PhaseError` unless the table moves ``src`` to ``dst``."""
        if self.after(src) != dst:
            shown = "closed" if dst is None else dst.value
            raise PhaseError(f"a {self.name} round does not move from {src.value} to {shown}")

    def parse(self, stored: str) -> Phase:
        """The phase a stored string names, if this plan has it; else :class:`PhaseError`."""
        try:
            phase = Phase(stored)
        except ValueError:
            raise PhaseError(f"unknown phase {stored!r}") from None
        self.after(phase)
        return phase


PLAIN = RoundPlan("plain", {Phase.UPLOAD: None})
SECURE = RoundPlan("secure", {
    Phase.ADVERTISE: Phase.SHARE,
    Phase.SHARE: Phase.UPLOAD,
    Phase.UPLOAD: Phase.SIGN,
    Phase.SIGN: Phase.UNMASK,
    Phase.UNMASK: None,
})


def plan_for(secure: bool) -> RoundPlan:
    return SECURE if secure else PLAIN
