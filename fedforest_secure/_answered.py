"""The rounds a worker has answered in its job, and what it refuses because of them.

A retried round (the same round id and the same task) gets the same reply; an older round, a
round already answered for another question, and a question answered in an earlier round are
refused (answering it again could isolate a client by differencing); so is a histogram slot
released in an earlier round of the level (:mod:`~fedforest_secure._slot_keys`: the same node,
feature and cuts, whatever the task's kind, slot order or statistics mode), except the one
step the coordinator takes, a slot whose counts a grid round released asked once more with its
statistics (the secure pooled-CDF sketch's candidates are often its grid's own edges); under
differential privacy each noisy aggregate a client releases is one of its job's planned
releases (:func:`planned_releases`), made once.
"""

from __future__ import annotations

import numpy as np

from ._slot_keys import SlotKeys, slot_keys
from ._sorted import distinct
from .config import JobConfig
from .errors import ProtocolError, RefusedRequest
from .protocol import Reply, Task, TaskKind, layout_size

__all__ = ["AnsweredRounds", "planned_releases"]


def planned_releases(config: JobConfig) -> dict[tuple[int, TaskKind], str]:
    """The noisy releases of a DP training job's plan, by the level and kind of the round that
    makes each (the levels of :func:`~fedforest_secure.privacy.allocation.job_noise`), with
    what each releases.

    Greedy splits: one histogram round per splitting level ``0 .. max_depth - 1``. Random
    splits: the level-0 histogram round of the marginal counts (with the class totals, if
    planned) and the last level's sketch round of the leaves' totals. Each noise scale holds
    for its release made once, in the planned shape: a second one (its noise averaged with
    the first's) or a round the plan does not have is spent budget the plan never accounted.
    """
    if config.method == "random":
        return {(0, TaskKind.HISTOGRAM): "the marginal counts",
                (config.max_depth, TaskKind.SKETCH): "the leaves' totals"}
    return {(level, TaskKind.HISTOGRAM): f"level {level}'s histograms"
            for level in range(config.max_depth)}


class AnsweredRounds:
    """What one worker has answered: its last round (and reply) and every question.

    Parameters
    ----------
    config : the job's configuration
    keep_last_reply : keep the last reply, so a retried round gets the same answer
    """

    def __init__(self, config: JobConfig, keep_last_reply: bool) -> None:
        self.config = config
        self._last_round: int | None = None
        self._last_reply: Reply | None = None
        self._last_digest = b""
        self._keep_last_reply = keep_last_reply
        self._questions: set[bytes] = set()
        self._dp_made: set[tuple[int, TaskKind]] = set()  # planned releases made (DP)
        # the histogram slots released at the current level (a worker never answers a
        # histogram of an earlier level): sorted keys, and per key whether its statistics
        # were released (True) or its counts only (False)
        self._slot_level = -1
        self._slots = np.zeros(0, dtype=np.uint64)
        self._slot_stats = np.zeros(0, dtype=bool)
        # the (node, feature) pairs of the current level whose sketch was disclosed, as
        # node * (n_features + 1) + feature, sorted
        self._sketch_level = -1
        self._sketched = np.zeros(0, dtype=np.int64)

    @property
    def keeps_reply(self) -> bool:
        """Whether the last reply is kept (a retried round gets it again)."""
        return self._keep_last_reply

    def replay(self, round_id: int, digest: bytes) -> Reply | None:
        """The reply already given in round ``round_id`` to the task of ``digest`` (a retry),
        or None for a round after the last one answered.

        Raises
        ------
        ProtocolError
            The round was answered for another question, or without keeping its reply, or
            is older than the last one answered.
        """
        if self._last_round is not None and round_id == self._last_round:
            if digest != self._last_digest:
                raise ProtocolError(f"round {round_id} was already answered for another "
                                    "question; refusing to answer it twice")
            if self._last_reply is None:
                raise ProtocolError(f"round {round_id} was already answered")
            return self._last_reply
        if self._last_round is not None and round_id < self._last_round:
            raise ProtocolError(f"round {round_id} is older than round {self._last_round}")
        return None

    def check_new(self, task: Task, question: bytes) -> SlotKeys | None:
        """Refuse a question answered in an earlier round, a histogram slot released in an
        earlier round (:meth:`_check_slots`), and under DP a noisy aggregate that is not one
        of the plan's releases (:func:`planned_releases`), or one already made. Returns the
        task's histogram slots, for :meth:`counted`.

        Raises
        ------
        RefusedRequest
            The question or one of its slots was answered before, or the release is not
            planned, not in its planned form, or made already.
        """
        if question in self._questions:
            raise RefusedRequest("this question was already answered in an earlier round; "
                                 "answering it again could isolate a client by differencing",
                                 code="question_reused")
        slots = slot_keys(self.config, task)
        if slots is not None:
            self._check_slots(task, slots)
        if self.config.dp is not None and layout_size(task.layout) > 0:
            self._check_planned(task)
        return slots

    def _check_slots(self, task: Task, slots: SlotKeys) -> None:
        """Refuse a histogram slot (node, feature, cuts) of the level released in an earlier
        round, in any form: a slot whose statistics were released, and a slot whose counts
        were released asked for its counts again. A slot whose counts only were released
        may be asked once for its statistics (the coordinator's histogram round on its grid
        round's edges)."""
        if task.level != self._slot_level or not self._slots.size or not slots.keys.size:
            return
        if not self._released_again(slots.distinct, slots.mode).any():
            return  # (the distinct keys, ascending, are searched much faster: same verdict)
        again = self._released_again(slots.keys, slots.mode)
        if again.any():  # the first such slot in the task's order, for the message
            i = int(np.flatnonzero(again)[0])
            node, feat = int(slots.nodes[i]), int(slots.features[i])
            what = (f"the totals of node {node}" if feat < 0
                    else f"the histogram of node {node}, feature {feat}")
            raise RefusedRequest(
                f"{what} at level {task.level}, with the same cuts, was already released in "
                "an earlier round (the task asks it again in another form: another task kind, "
                "slot order or statistics mode); answering it again could isolate a client "
                "by differencing", code="question_reused")

    def _released_again(self, keys: np.ndarray, mode: str) -> np.ndarray:
        """Per slot key, whether answering it would release it again (see
        :meth:`_check_slots`)."""
        pos = np.minimum(np.searchsorted(self._slots, keys), self._slots.size - 1)
        seen: np.ndarray = self._slots[pos] == keys
        return seen & (self._slot_stats[pos] | (mode == "count"))

    def check_sketch(self, level: int, nodes: np.ndarray, feats: np.ndarray) -> np.ndarray:
        """Refuse a sketch (its points, or its top-L ranking) of a node's feature at ``level``
        disclosed before at the level: asked again with another number of points, its
        quantiles at other ranks would show more of the client's values than the profile's
        ``rows_per_sketch_point`` allows. ``nodes`` (E,) and ``feats`` (E, m), -1 for no
        feature. Returns the pairs' keys, for :meth:`count_sketch`.

        Raises
        ------
        RefusedRequest
            (code ``question_reused``) one of the pairs was sketched at the level already.
        """
        valid = feats >= 0
        node = np.broadcast_to(np.asarray(nodes, dtype=np.int64)[:, None], feats.shape)
        keys = node[valid] * (self.config.n_features + 1) + feats[valid].astype(np.int64)
        if level == self._sketch_level and self._sketched.size:
            again = np.isin(keys, self._sketched)
            if again.any():
                i = int(np.flatnonzero(again)[0])
                raise RefusedRequest(
                    f"the sketch of node {int(node[valid][i])}, feature "
                    f"{int(feats[valid][i])} at level {level} was already disclosed; another "
                    "sketch of it (other quantile points) would show more of this client's "
                    "values than its profile allows", code="question_reused")
        return keys

    def count_sketch(self, level: int, keys: np.ndarray) -> None:
        """Count the sketches of ``keys`` (from :meth:`check_sketch`) as disclosed."""
        if level != self._sketch_level:  # a new level: the earlier one's are never asked again
            self._sketch_level, self._sketched = level, distinct(keys)
        else:
            self._sketched = distinct(np.concatenate((self._sketched, keys)))

    def _check_planned(self, task: Task) -> None:
        """Refuse a noisy release that is not one of the plan's, or one already made."""
        cfg = self.config
        plan = planned_releases(cfg)
        key = (task.level, task.kind)
        name = f"level-{task.level} {task.kind.value} release"
        if key not in plan:
            made = ", ".join(f"level {lv} {k.value} ({what})" for (lv, k), what in plan.items())
            raise RefusedRequest(f"refusing a noisy aggregate outside the job's DP plan: the "
                                 f"plan has no {name}; this client releases noisy "
                                 f"aggregates only in {made}")
        if key in self._dp_made:
            raise RefusedRequest(f"privacy budget spent: the job's DP plan's {name} "
                                 f"({plan[key]}) was already made; a second would average "
                                 "its noise away")
        if cfg.method == "random" and (
                task.kind is TaskKind.HISTOGRAM and task.params.get("stats") != "count"
                or task.kind is TaskKind.SKETCH
                and any(k.startswith("grid_") for k in task.arrays)):
            # the marginal counts are counts; the leaves' release is their node totals only
            # (a histogram beside them would release the totals twice in one vector)
            raise RefusedRequest(f"the {name} of the job's DP plan releases {plan[key]} "
                                 "only" + (" (stats 'count')"
                                           if task.kind is TaskKind.HISTOGRAM else
                                           ", without a histogram"))

    def answered(self, round_id: int, digest: bytes, reply: Reply) -> None:
        """Record ``reply`` as the answer of round ``round_id`` to the task of ``digest``."""
        self._last_round, self._last_digest = round_id, digest
        # the last reply is kept so a retried round gets the same answer; an in-process
        # federation, which never retries, can skip keeping it (memory)
        self._last_reply = reply if self._keep_last_reply else None

    def counted(self, task: Task, question: bytes, slots: SlotKeys | None = None) -> None:
        """Count ``task``'s question as answered, and its histogram ``slots`` (from
        :meth:`check_new`) as released (and under DP its planned release as made)."""
        self._questions.add(question)
        if slots is not None:
            self._count_slots(task.level, slots)
        if self.config.dp is not None and layout_size(task.layout) > 0:
            self._dp_made.add((task.level, task.kind))

    def _count_slots(self, level: int, slots: SlotKeys) -> None:
        stats_new = np.full(slots.distinct.size, slots.mode != "count")
        if level != self._slot_level or not self._slots.size:
            # a new level (the earlier one's are never asked again): the task's slots alone
            self._slot_level = level
            self._slots, self._slot_stats = slots.distinct, stats_new
            return
        keys = np.concatenate([self._slots, slots.distinct])
        stats = np.concatenate([self._slot_stats, stats_new])
        order = np.lexsort((~stats, keys))  # per key, a statistics release first
        keys, stats = keys[order], stats[order]
        first = np.ones(keys.size, dtype=bool)
        first[1:] = keys[1:] != keys[:-1]
        self._slots, self._slot_stats = keys[first], stats[first]
