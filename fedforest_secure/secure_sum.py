"""Fixed-point encoding of replies and secure summation for profiles with ``fixed_point``.

Every summable vector is divided by a public per-entry scale (1 for counts, the target bound
for sums of y, its square for sums of y^2 and for regression gains), range-checked and encoded
into the 64-bit ring by :class:`~fedforest_secure.secagg.RingCodec`. Under
``secure_aggregation`` the encodings are masked (pairwise masks with Shamir-shared keys) so the
server recovers only their sum; with ``secure_aggregation = false`` the same encodings are summed
in the clear, so both settings grow the same forest (invariant 2).

A masked upload cannot be range-checked, but the sum can: every sum of ``K`` uploads is decoded
by :meth:`StatCodec.decode_sum`, which refuses an entry no ``K`` range-checked encodings add up
to (:class:`~fedforest_secure.errors.SumOutOfRange`): a site sent values outside the codec's
range, and no aggregate is released.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from ._packing import Packing, packs
from .config import JobConfig
from .errors import BudgetError, InvalidMessage, OverflowRisk, SumOutOfRange
from .privacy.profile import with_profile_defaults
from .protocol import Block, Reply, StatKind, Task, kind_code, kinds_vector
from .secagg import RingCodec
from .secagg.encoding import Periodic

if TYPE_CHECKING:
    from .secagg.driver import InProcessSecureSum

__all__ = ["RingAggregator", "StatCodec", "SumBounds", "check_frac_bits", "encode_contribution",
           "entry_scale_bits", "make_codec", "most_frac_bits", "noise_sigmas", "noise_units",
           "unmask_floor"]

#: Largest |value| per client, in units of the entry's scale (rows times bound).
_MAX_ROWS = float(2**28)
_MAX_COUNT = float(2**36)
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class SumBounds:
    """What one site's encoding can hold, per statistic kind, and so what the ring sum of
    ``K`` sites' encodings can: ``|sum| <= K x site``, and ``sum >= 0`` for kinds whose every
    encoding is (:meth:`StatCodec.check_sum`).

    Every kind is indexed by :func:`~fedforest_secure.protocol.kind_code`."""

    #: per layout block with statistics: the kind codes of its columns and its rows (the
    #: codec's runs, in entry order)
    runs: tuple[tuple[tuple[int, ...], int], ...]
    #: per kind: the largest |encoding| of one site in ring units, ``rint(max_abs x
    #: 2^frac_bits)`` (the codec range-checks every value before it encodes it)
    site: tuple[int, ...]
    #: per kind: one site's encoding is never negative (counts and sums of squares of a job
    #: without DP noise)
    nonneg: tuple[bool, ...]
    #: per kind: statistic units per ring unit (``scale / 2^frac_bits``), for messages
    unit: tuple[float, ...]
    #: DP jobs whose sites add discrete-Gaussian noise to their encodings in the ring: per
    #: kind, the largest |noise| one site can add (:func:`_noise_bounds`), computed when a sum
    #: is checked; None without such noise
    noise: Callable[[], Mapping[int, int]] | None = None


@dataclass(frozen=True)
class StatCodec:
    """Scale then fixed-point-encode one round's summable vector (and, under secure
    aggregation with a task that names a count lane, pack its grid cells two entries to a word:
    :mod:`fedforest_secure._packing`)."""

    ring: RingCodec
    #: per entry: one for all, per-entry values, or one value per column of each layout block
    scale: np.ndarray | Periodic | float
    #: the packing of the uploaded words, or None: one word per entry
    packing: Packing | None = None
    #: what a sum of sites' encodings can hold (:meth:`check_sum`); None: not checked
    bounds: SumBounds | None = None

    @property
    def words(self) -> int:
        """Words of a client's upload (and of the masked sum)."""
        return self.ring.size if self.packing is None else self.packing.words

    def encode(self, values: np.ndarray) -> np.ndarray:
        """One client's upload: the encoded entries, packed if the codec packs."""
        return self.pack(self.encode_entries(values))

    def encode_entries(self, values: np.ndarray) -> np.ndarray:
        """The ring encoding of every entry (one word each)."""
        vals = np.asarray(values, dtype=np.float64)
        if isinstance(self.scale, float) and self.scale == 1.0:
            return self.ring.encode(vals)  # v / 1.0 == v exactly: no pass, no temporary
        return self.ring.encode_divided(vals, self.scale)

    def pack(self, entries: np.ndarray) -> np.ndarray:
        return entries if self.packing is None else self.packing.pack(entries)

    def decode(self, total: np.ndarray) -> np.ndarray:
        """The sum's statistics from the sum of the uploads (unpacked first if packed), not
        checked: a sum of uploads is decoded by :meth:`decode_sum`."""
        return self._decode_entries(total if self.packing is None
                                    else self.packing.unpack(total))

    def _decode_entries(self, entries: np.ndarray) -> np.ndarray:
        out = self.ring.decode(entries)
        if isinstance(self.scale, Periodic):
            for a, b, pat in self.scale.rows():
                rows = out[a:b].reshape(-1, pat.size)
                np.multiply(rows, pat, out=rows)
            return out
        return out * self.scale

    def check_sum(self, entries: np.ndarray, contributors: int) -> None:
        """Raise :class:`~fedforest_secure.errors.SumOutOfRange` for the first entry of a
        ring sum (unpacked: one uint64 per entry) that ``contributors`` sites' encodings cannot
        add up to (:class:`SumBounds`): a site sent values outside the codec's range."""
        b = self.bounds
        if b is None:
            raise ValueError("this codec has no bounds on its sums (build it with make_codec)")
        if isinstance(contributors, bool) or not isinstance(contributors, int) \
                or contributors < 1:
            raise ValueError(f"contributors must be a positive int, got {contributors!r}")
        arr = np.asarray(entries)
        if arr.dtype != np.uint64 or arr.shape != (self.ring.size,):
            raise ValueError(f"expected a uint64 vector of {self.ring.size} entries")
        signed = arr.view(np.int64)
        noise = b.noise() if b.noise is not None else {}
        at = 0
        for pattern, rows in b.runs:
            width = len(pattern)
            block = signed[at:at + width * rows].reshape(rows, width)
            first: tuple[int, int, int, int] | None = None  # entry, kind, low, high
            for j, code in enumerate(pattern):
                high = min(contributors * (b.site[code] + noise.get(code, 0)), _INT64_MAX)
                low = 0 if b.nonneg[code] else -high
                col = block[:, j]
                if int(col.max()) <= high and int(col.min()) >= low:
                    continue
                row = int(np.flatnonzero((col > high) | (col < low))[0])
                if first is None or at + row * width + j < first[0]:
                    first = (at + row * width + j, code, low, high)
            if first is not None:
                entry, code, _, high = first
                unit = b.unit[code]
                value, bound = float(signed[entry]) * unit, float(high) * unit
                shown = f"[0, {bound:.6g}]" if b.nonneg[code] else f"{bound:.6g}"
                sites = "1 site's encoding" if contributors == 1 else \
                    f"{contributors} sites' encodings"
                raise SumOutOfRange(
                    f"the aggregate lies outside what {sites} can sum to (entry {entry}: value "
                    f"{value:.6g}, bound {shown}): a site sent values outside the codec's range",
                    entry=entry, value=value, bound=bound)
            at += width * rows

    def decode_sum(self, total: np.ndarray, contributors: int) -> np.ndarray:
        """:meth:`decode` of the sum of ``contributors`` sites' uploads, checked first: raises
        :class:`~fedforest_secure.errors.SumOutOfRange` for an entry no ``contributors``
        honest encodings can sum to (:meth:`check_sum`), and, where grid cells are packed,
        :class:`~fedforest_secure.errors.OverflowRisk` for a count lane that wrapped
        (:meth:`~fedforest_secure._packing.Packing.unpack`). Every sum of uploads a server
        or an in-process run releases is decoded by this."""
        entries = total if self.packing is None else self.packing.unpack(total)
        self.check_sum(np.asarray(entries), contributors)
        return self._decode_entries(entries)

    def quantum(self) -> np.ndarray:
        """Value of one unit of the ring per entry (the resolution of the encoding)."""
        unit: np.ndarray = self.scale * np.ldexp(1.0, -self.ring.frac_bits)
        return unit


def _scales(config: JobConfig) -> dict[str, float]:
    bound = float(config.target_bound) if config.task == "regression" else 1.0
    bound = bound if bound > 0 else 1.0
    gain_scale = bound * bound if config.task == "regression" else max(
        1.0, math.log2(max(config.n_classes, 2)))
    return {StatKind.COUNT.value: 1.0, StatKind.SUM.value: bound,
            StatKind.SUMSQ.value: bound * bound, StatKind.GAIN.value: gain_scale}


def entry_scale_bits(config: JobConfig, kind: StatKind) -> float:
    """Ring units per unit of a statistic of this kind: ``2**frac_bits / scale`` (1 for counts)."""
    if kind is StatKind.COUNT:
        return 1.0
    frac = int(config.profile.get("frac_bits", 24))
    return float(2.0**frac) / _scales(config)[kind.value]


def most_frac_bits(n_clients: int) -> int:
    """The largest ``frac_bits`` at which ``n_clients`` sites' fixed-point sums fit the signed
    64-bit ring: a site's sum of y (or y^2) stands for at most 2^28 rows at the unit bound,
    scaled by ``2**frac_bits``; 0 if none does."""
    most = 63 - int(_MAX_ROWS).bit_length()  # one site alone: 2^28 * 2^34 < 2^63
    while most > 0 and max(n_clients, 1) * int(_MAX_ROWS) * 2**most > _INT64_MAX:
        most -= 1
    return most


def check_frac_bits(config: JobConfig) -> None:
    """Raise :class:`~fedforest_secure.errors.OverflowRisk` if the profile's ``frac_bits``
    is more than the job's sites' ring sums hold (:func:`most_frac_bits`)."""
    frac = int(config.profile.get("frac_bits", 24))
    most = most_frac_bits(config.n_clients)
    if frac > most:
        raise OverflowRisk(
            f"frac_bits = {frac} is more than {config.n_clients} sites' fixed-point sums hold: "
            f"at most {most} (each site's sums are scaled by 2^frac_bits, and the sites' sum "
            "must fit the signed 64-bit ring); lower frac_bits in the profile")


def make_codec(config: JobConfig, task: Task) -> StatCodec:
    """The codec of a task's summable vector, from its layout's statistic kinds."""
    # keyed by the config object (kept alive by its entry, so its id is not reused): every
    # client of an in-process round asks for the same codec, and config.to_json is slow
    key = (id(config), task.round_id, task.layout, task.params.get("pack"))
    hit = _CODEC_CACHE.get(key)
    if hit is not None and hit[0] is config:
        return hit[1]
    check_frac_bits(config)
    frac = int(config.profile.get("frac_bits", 24))
    scales = _scales(config)
    per_kind_scale = np.array([scales[k.value] for k in StatKind])
    per_kind_bits = np.array([0 if k is StatKind.COUNT else frac for k in StatKind],
                             dtype=np.int64)
    per_kind_max = np.array([_MAX_COUNT if k is StatKind.COUNT else _MAX_ROWS
                             for k in StatKind])
    # per block, its columns' kinds once per row: the codec tiles them (no per-entry gathers)
    runs = [([kind_code(k) for k in b.kinds], b.size // len(b.kinds)) for b in task.layout
            if b.kinds]
    ring = RingCodec._from_runs(runs, per_kind_bits, per_kind_max, max(config.n_clients, 1))
    used = sorted({c for pattern, rows in runs if rows for c in pattern})
    scale: np.ndarray | Periodic | float
    if len({float(per_kind_scale[c]) for c in used}) == 1:
        scale = float(per_kind_scale[used[0]])  # one scale for every entry (e.g. counts only)
    elif used:
        scale = Periodic([(per_kind_scale[p], r) for p, r in runs if r])
    else:
        scale = np.ones(0)
    noisy = config.dp is not None and config.evaluation is None
    bounds = SumBounds(
        runs=tuple((tuple(pattern), rows) for pattern, rows in runs if rows and pattern),
        site=tuple(int(np.rint(np.ldexp(m, int(f)))) for m, f in zip(per_kind_max, per_kind_bits,
                                                                       strict=True)),
        # no DP noise: a site's count or sum of squares is rounded from a value >= 0; with
        # noise (in the ring, or an evaluation site's in its reply) it may come out below 0
        nonneg=tuple(config.dp is None and k in (StatKind.COUNT, StatKind.SUMSQ)
                     for k in StatKind),
        unit=tuple(float(np.ldexp(sc, -int(f))) for sc, f in zip(per_kind_scale, per_kind_bits,
                                                                 strict=True)),
        noise=partial(_noise_bounds, config, task.layout, task.level) if noisy else None)
    codec = StatCodec(ring=ring, scale=scale, packing=_packing_of(config, task), bounds=bounds)
    # several sites' clients may be threads of one process: the eviction and the insert are
    # one step (two threads evicting the same oldest entry stopped one on a KeyError)
    with _CODEC_LOCK:
        while len(_CODEC_CACHE) >= 2:  # per-entry arrays: a few times the vector's size each
            _CODEC_CACHE.pop(next(iter(_CODEC_CACHE)))
        _CODEC_CACHE[key] = (config, codec)
    return codec


_CODEC_CACHE: dict[object, tuple[JobConfig, StatCodec]] = {}
_CODEC_LOCK = threading.Lock()


def _packing_of(config: JobConfig, task: Task) -> Packing | None:
    bits = task.params.get("pack")
    if bits is None or not packs(config):
        return None
    try:
        return Packing.of(task.layout, bits)
    except ValueError as exc:
        raise InvalidMessage(f"the task's packing: {exc}") from None


def _noise_bounds(config: JobConfig, layout: tuple[Block, ...], level: int) -> dict[int, int]:
    """Per kind code: the largest |noise| one site adds to an entry of this release
    (:func:`encode_contribution`, from :func:`noise_sigmas`)."""
    from .privacy._sampling import discrete_gaussian_bound

    sigmas, _ = noise_sigmas(config, layout, level)
    return {kind_code(StatKind(k)): discrete_gaussian_bound(float(v)) for k, v in sigmas.items()}


def noise_units(config: JobConfig) -> dict[str, float]:
    """Ring units per unit of each summable statistic kind (the units the noise is added in)."""
    return {k.value: entry_scale_bits(config, k)
            for k in (StatKind.COUNT, StatKind.SUM, StatKind.SUMSQ)}


def noise_sigmas(config: JobConfig, layout: tuple[Block, ...], level: int
                 ) -> tuple[dict[str, float], int]:
    """Each client's discrete-Gaussian noise scale (ring units) per statistic kind of a release.

    A pure function of the job's public configuration, the round's layout and its level, so
    every client computes it from its own profile: the server cannot lower it. The job's noise
    plan (:func:`~fedforest_secure.privacy.allocation.job_noise`) gives each splitting level's
    histogram release its share of the zCDP budget and calibrates all releases together so the
    whole job is exactly (epsilon, delta)-DP. Sensitivity follows from per-bin histograms
    (invariant 3): a record counts once per feature slot and tree it sits in, times its
    bootstrap multiplicity. Returns the scales and ``K_min``, the survivors the noise is
    calibrated for.
    """
    from .privacy.allocation import job_noise

    if config.dp is None or config.evaluation is not None:
        # an evaluation job's sites add their noise to their replies, per statistics block
        # (fedforest_secure.evaluation.noise): nothing more in the ring
        return {}, 0
    present = sorted({k.value for b in layout for k in b.kinds})
    if not present:
        return {}, 0
    plan = job_noise(config, noise_units(config))
    sigmas = plan.level_sigmas(level)
    missing = [k for k in present if k not in sigmas]
    if missing:
        raise BudgetError(f"no DP calibration for statistic {missing[0]!r}")
    return {k: sigmas[k] for k in present}, plan.k_min


def encode_contribution(config: JobConfig, task: Task, reply: Reply) -> np.ndarray:
    """What a client uploads for a round: its reply encoded in the ring (plus DP noise, if any),
    packed where the codec packs (:attr:`StatCodec.packing`).

    This runs on the client, before masking; the server only ever adds these up.
    """
    codec = make_codec(config, task)
    encoded = codec.encode_entries(reply.summable)
    if config.dp is not None and encoded.size:
        from .privacy import sample_discrete_gaussian

        # the client's own calibration: never the server's word (task.params is informational)
        sigmas, _ = noise_sigmas(config, task.layout, task.level)
        kinds = kinds_vector(task.layout)
        noise = np.zeros(encoded.size, dtype=np.int64)
        for kind, sigma in sigmas.items():
            sel = kinds == kind_code(StatKind(kind))
            if float(sigma) > 0 and sel.any():
                noise[sel] = sample_discrete_gaussian(float(sigma), int(sel.sum()))
        encoded = encoded + noise.view(np.uint64)  # wraps mod 2^64: signed noise in the ring
    return codec.pack(encoded)


class RingAggregator:
    """Sums ring encodings: masked (secure aggregation) or in the clear, same result.

    With ``record=True`` it keeps what a server saw (:attr:`transcript`, every masked upload
    of the job) and the last round's encodings (:attr:`last_encoded`): for tests and audits;
    without, memory stays O(vector) per round.
    """

    def __init__(self, config: JobConfig, *, record: bool = False) -> None:
        check_frac_bits(config)
        self.config = config
        prof = with_profile_defaults(config.profile)  # PrivacyProfile's defaults
        self.secure = bool(prof.get("secure_aggregation"))
        self.min_clients = int(prof["min_clients"])
        self.record = record
        self._secagg: InProcessSecureSum | None = None
        if self.secure:
            from .secagg.driver import InProcessSecureSum

            self._secagg = InProcessSecureSum(range(config.n_clients),
                                              threshold=float(prof["threshold"]),
                                              job_id=config.job_id, streaming=True,
                                              record=record,
                                              min_survivors=unmask_floor(config))
        self.last_encoded: dict[int, np.ndarray] = {}

    @property
    def transcript(self) -> list[object]:
        return self._secagg.transcript if self._secagg is not None else []

    def aggregate(self, task: Task, replies: Mapping[int, Reply]) -> np.ndarray:
        encoded = {k: encode_contribution(self.config, task, r) for k, r in replies.items()}
        return self.sum_encoded(task, encoded)

    def aggregate_stream(self, task: Task, answer: Callable[[int], Reply], n_clients: int
                         ) -> tuple[np.ndarray, dict[int, dict[str, np.ndarray]]]:
        """Ask the clients one by one (``answer(k)``), keep only each one's ring encoding
        (what it would upload), then sum: no client's float vector outlives its encoding."""
        encoded: dict[int, np.ndarray] = {}
        disclosed: dict[int, dict[str, np.ndarray]] = {}
        if self._secagg is not None and not self.record:
            # masked one client at a time: each encoding is masked in place and uploaded
            # before the next client answers
            def produce(k: int) -> np.ndarray:
                reply = answer(k)
                if reply.disclosed:
                    disclosed[k] = reply.disclosed
                return encode_contribution(self.config, task, reply)

            codec = make_codec(self.config, task)
            total = self._secagg.sum_produced(task.question_digest().hex(), task.digest(),
                                              range(n_clients), codec.words, produce)
            return codec.decode_sum(total, n_clients), disclosed
        running: np.ndarray | None = None
        for k in range(n_clients):
            reply = answer(k)
            if reply.disclosed:
                disclosed[k] = reply.disclosed
            enc = encode_contribution(self.config, task, reply)
            del reply
            if self._secagg is None and not self.record:  # in the clear: add as they come
                if running is None:
                    running = enc
                else:
                    running += enc  # uint64: wraps mod 2^64 like the masked sum
            else:
                encoded[k] = enc
        if running is not None:
            return make_codec(self.config, task).decode_sum(running, n_clients), disclosed
        return self.sum_encoded(task, encoded), disclosed

    def sum_encoded(self, task: Task, encoded: dict[int, np.ndarray]) -> np.ndarray:
        """The decoded sum of the clients' ring encodings (masked when secure)."""
        codec = make_codec(self.config, task)
        self.last_encoded = encoded if self.record else {}
        if self._secagg is not None:
            question = task.question_digest().hex()  # differencing: one answer per question
            total = self._secagg.sum(question, task.digest(), encoded)
        else:
            total = np.zeros(codec.words, dtype=np.uint64)
            for k in sorted(encoded):
                total += encoded[k]
        return codec.decode_sum(total, len(encoded))


def unmask_floor(config: JobConfig) -> int:
    """The fewest survivors a client helps unmask in this job: 3, the profile's ``min_clients``,
    and under DP the ``K_min`` its noise is calibrated for (a sum over fewer would carry less
    noise than the budget says). Computed from the configuration the client checked at join."""
    prof = with_profile_defaults(config.profile)  # PrivacyProfile's defaults
    floor = max(3, int(prof["min_clients"]))
    dp = config.dp
    if dp is None:
        return floor
    from .privacy.dp import min_survivors  # diffprivlib and SciPy: only a DP job loads them

    tol = dp.get("dropout_tolerance")
    if tol is None:
        tol = max(0.0, 1.0 - float(prof["threshold"]))
    return max(floor, min_survivors(config.n_clients, min(float(tol), 0.999)))
