"""Mechanism audits: sample a round (or T rounds) on a neighbouring pair, vectorised.

Each mechanism here is the output of one privatized round projected on the
direction that separates the pair, sampled with numpy for millions of trials
at once. :func:`audit_mechanism` runs the optimal score test (the log
likelihood ratio of one round; summed over rounds for T rounds) with its
threshold chosen on pilot trials, and converts its error counts into an ε
lower bound with :func:`dpfl.audit.stats.score_audit`.

The random-participation mechanisms take the neighbouring client's other
records into account, the configurations the sound analysis must cover:

``zero``
    the other sampled records have zero gradient: the round is the
    Poisson-subsampled Gaussian at rate ``p·q``;
``collinear``
    they have full-norm gradients along the target's (the configuration
    Theorem 4.1 of Hasircioglu & Gündüz, arXiv 2205.01556, analyses);
``angled``
    they have full-norm gradients at an angle to the target's (2-D output).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol

import numpy as np
from scipy import special, stats

from dpfl._validate import check_count, check_positive, check_probability
from dpfl.audit.stats import AuditResult, score_audit
from dpfl.errors import InvalidParameterError

__all__ = [
    "GaussianPair",
    "MechanismPair",
    "PrivatizerPair",
    "RandomParticipationPair",
    "SubsampledGaussianPair",
    "audit_mechanism",
]


class MechanismPair(Protocol):
    """One round of a mechanism on a neighbouring pair ``D`` (null), ``D'``."""

    def sample(
        self, rng: np.random.Generator, n: int, *, neighbour: bool
    ) -> np.ndarray:
        """``n`` outputs ``[n, dim]`` of one round on ``D'`` (neighbour) or ``D``."""
        ...

    def log_ratio(self, x: np.ndarray) -> np.ndarray:
        """``ln p_{D'}(x) − ln p_D(x)`` of each output ``[n, dim]``."""
        ...


@dataclasses.dataclass(frozen=True)
class GaussianPair:
    """The Gaussian mechanism: ``N(0, σ²)`` against ``N(Δ, σ²)``."""

    noise_multiplier: float
    sensitivity: float = 1.0

    def __post_init__(self) -> None:
        check_positive("noise_multiplier", self.noise_multiplier)
        check_positive("sensitivity", self.sensitivity)

    @property
    def _sigma(self) -> float:
        return self.noise_multiplier * self.sensitivity

    def sample(
        self, rng: np.random.Generator, n: int, *, neighbour: bool
    ) -> np.ndarray:
        """Outputs ``[n, 1]``."""
        shift = self.sensitivity if neighbour else 0.0
        return shift + self._sigma * rng.standard_normal((n, 1))

    def log_ratio(self, x: np.ndarray) -> np.ndarray:
        """Linear in the output."""
        s, c = self._sigma, self.sensitivity
        return (2 * x[:, 0] * c - c * c) / (2 * s * s)


@dataclasses.dataclass(frozen=True)
class SubsampledGaussianPair:
    """Poisson-subsampled Gaussian: the target is in the batch w.p. ``rate``."""

    rate: float
    noise_multiplier: float
    sensitivity: float = 1.0

    def __post_init__(self) -> None:
        check_probability("rate", self.rate)
        check_positive("noise_multiplier", self.noise_multiplier)
        check_positive("sensitivity", self.sensitivity)

    def sample(
        self, rng: np.random.Generator, n: int, *, neighbour: bool
    ) -> np.ndarray:
        """Outputs ``[n, 1]``."""
        sigma = self.noise_multiplier * self.sensitivity
        x = sigma * rng.standard_normal((n, 1))
        if neighbour:
            x[:, 0] += self.sensitivity * (rng.random(n) < self.rate)
        return x

    def log_ratio(self, x: np.ndarray) -> np.ndarray:
        """``ln((1 − r) + r · e^{L(x)})`` with L the Gaussian log ratio."""
        g = GaussianPair(self.noise_multiplier, self.sensitivity).log_ratio(x)
        return np.logaddexp(math.log1p(-self.rate), math.log(self.rate) + g)


@dataclasses.dataclass(frozen=True)
class RandomParticipationPair:
    """One round of DP-DSGD with random participation, record level (add/remove).

    The neighbouring client joins w.p. ``p``; each of its ``d`` other records
    is sampled w.p. ``q``, and so is the target record (only in ``D'``). The
    trusted server adds ``N(0, σ² C² I)`` to the sum of clipped gradients.
    The other clients' contributions are known to the adversary and omitted.

    Parameters
    ----------
    participation_probability, record_probability : float
        p and q.
    records_per_client : int
        d, the neighbouring client's other records.
    noise_multiplier : float
        σ (noise std on the sum, in units of C).
    configuration : {"zero", "collinear", "angled"}
        The other records' gradients (module docstring).
    angle : float
        Angle (radians) of the companions to the target for ``"angled"``.
    clip : float
        C.
    """

    participation_probability: float
    record_probability: float
    records_per_client: int
    noise_multiplier: float
    configuration: str = "zero"
    angle: float = math.pi / 2
    clip: float = 1.0

    def __post_init__(self) -> None:
        check_probability("participation_probability", self.participation_probability)
        check_probability("record_probability", self.record_probability)
        check_count("records_per_client", self.records_per_client, minimum=0)
        check_positive("noise_multiplier", self.noise_multiplier)
        check_positive("clip", self.clip)
        if self.configuration not in ("zero", "collinear", "angled"):
            raise InvalidParameterError(
                "configuration must be one of ['angled', 'collinear', 'zero']; got "
                f"{self.configuration!r}"
            )

    @property
    def _dim(self) -> int:
        return 2 if self.configuration == "angled" else 1

    def _companion(self) -> np.ndarray:
        """One companion's gradient (zero for ``"zero"``)."""
        c = self.clip
        if self.configuration == "zero":
            return np.zeros(self._dim)
        if self.configuration == "collinear":
            return np.array([c])
        return c * np.array([math.cos(self.angle), math.sin(self.angle)])

    def _target(self) -> np.ndarray:
        t = np.zeros(self._dim)
        t[0] = self.clip
        return t

    def sample(
        self, rng: np.random.Generator, n: int, *, neighbour: bool
    ) -> np.ndarray:
        """Outputs ``[n, dim]``."""
        p, q, d = (
            self.participation_probability,
            self.record_probability,
            self.records_per_client,
        )
        sigma = self.noise_multiplier * self.clip
        joined = rng.random(n) < p
        count = rng.binomial(d, q, size=n) * joined
        x = sigma * rng.standard_normal((n, self._dim))
        x += count[:, None] * self._companion()[None, :]
        if neighbour:
            took = joined & (rng.random(n) < q)
            x += took[:, None] * self._target()[None, :]
        return x

    def log_ratio(self, x: np.ndarray) -> np.ndarray:
        """Log-likelihood ratio of the one-round mixtures (labels >= 1e-9 of the max).

        Exact for ``"zero"`` (the rate-pq subsampled Gaussian); for the other
        configurations the labels of negligible weight are dropped, which
        changes the score, not the validity of the audit (any score gives a
        valid test).
        """
        p, q, d = (
            self.participation_probability,
            self.record_probability,
            self.records_per_client,
        )
        if self.configuration == "zero":
            pair = SubsampledGaussianPair(p * q, self.noise_multiplier, self.clip)
            return pair.log_ratio(x)
        sigma = self.noise_multiplier * self.clip
        i = np.arange(d + 1)
        w = stats.binom.pmf(i, d, q)
        keep = w >= 1e-9 * w.max()
        i, w = i[keep], w[keep]
        comp, target = self._companion(), self._target()
        means = i[:, None] * comp[None, :]  # [labels, dim]
        # Squared distances [n, labels] to each label's mean and mean + target.
        scale = -0.5 / sigma**2
        base = scale * np.sum((x[:, None, :] - means[None]) ** 2, axis=-1)
        plus = scale * np.sum((x[:, None, :] - means[None] - target) ** 2, axis=-1)
        absent = scale * np.sum(x**2, axis=-1)
        log_w = np.log(w)[None, :]
        with np.errstate(divide="ignore"):
            log_p1, log_q1 = math.log(p), math.log1p(-q) if q < 1 else -np.inf
            log_q = special.logsumexp(log_w + base, axis=1) + log_p1
            both = np.logaddexp(log_q1 + base, math.log(q) + plus)
            log_p = special.logsumexp(log_w + both, axis=1) + log_p1
            if p < 1:
                log_q = np.logaddexp(math.log1p(-p) + absent, log_q)
                log_p = np.logaddexp(math.log1p(-p) + absent, log_p)
        return log_p - log_q


@dataclasses.dataclass(frozen=True)
class PrivatizerPair:
    """A dpfl privatizer's own noise draw on one contribution of norm C, or none.

    Each coordinate of one :meth:`~dpfl.sim.privatize.Privatizer.add_noise`
    call is one trial (the noise is isotropic): the neighbour's contribution
    is ``C e_j`` in trial ``j``. The score is the output itself (the likelihood
    ratio of a Gaussian shift is monotone in it), so the audit tests the noise
    the privatizer really draws, not the scale it claims.

    Parameters
    ----------
    privatizer : dpfl.sim.privatize.Privatizer
        The privatizer (with ``clip``) under audit.
    num_participants, num_available : int
        The round's counts passed to it.
    """

    privatizer: Any
    num_participants: int = 1
    num_available: int = 1

    def sample(
        self, rng: np.random.Generator, n: int, *, neighbour: bool
    ) -> np.ndarray:
        """Outputs ``[n, 1]`` drawn by the privatizer (float64)."""
        import torch

        g = torch.Generator().manual_seed(int(rng.integers(2**62)))
        clip = float(self.privatizer.clip)
        total = torch.full((n,), clip if neighbour else 0.0, dtype=torch.float64)
        out = self.privatizer.add_noise(
            {"w": total},
            num_participants=self.num_participants,
            num_available=self.num_available,
            generator=g,
        )["w"]
        return out.numpy()[:, None]

    def log_ratio(self, x: np.ndarray) -> np.ndarray:
        """The output (monotone in the Gaussian shift's likelihood ratio)."""
        return np.asarray(x[:, 0], dtype=np.float64)


def _scores(
    pair: MechanismPair,
    rng: np.random.Generator,
    n: int,
    rounds: int,
    neighbour: bool,
    chunk: int,
) -> np.ndarray:
    """The T-round log-likelihood-ratio score of ``n`` trials (in chunks)."""
    out = np.zeros(n)
    for start in range(0, n, chunk):
        size = min(chunk, n - start)
        for _ in range(rounds):
            out[start : start + size] += pair.log_ratio(
                pair.sample(rng, size, neighbour=neighbour)
            )
    return out


def audit_mechanism(
    pair: MechanismPair,
    *,
    trials: int,
    delta: float,
    rounds: int = 1,
    confidence: float = 0.95,
    pilot_fraction: float = 0.1,
    seed: int = 0,
    chunk: int = 1_000_000,
) -> AuditResult:
    """An ε lower bound for ``rounds`` rounds of ``pair``, by the likelihood-ratio test.

    Parameters
    ----------
    pair : MechanismPair
        The round on the neighbouring pair.
    trials : int
        Trials on each side that are counted (>= 1).
    delta : float
        δ of the bound.
    rounds : int
        T, rounds composed (scores summed: the optimal test for a product).
    confidence : float
        Probability that the bound holds.
    pilot_fraction : float
        Extra trials, as a fraction of ``trials``, drawn to choose the
        threshold (never counted).
    seed : int
        Seed of the audit's randomness.
    chunk : int
        Trials sampled at once (memory bound).

    Returns
    -------
    AuditResult
        The bound, its counts and threshold.

    Examples
    --------
    >>> res = audit_mechanism(GaussianPair(1.0), trials=20000, delta=1e-3, seed=1)
    >>> 0 < res.epsilon < 3.0  # the Gaussian's true ε at δ = 1e-3 is about 3.1
    True
    """
    trials = check_count("trials", trials, minimum=1)
    rounds = check_count("rounds", rounds, minimum=1)
    chunk = check_count("chunk", chunk, minimum=1)
    pilot_fraction = check_positive("pilot_fraction", pilot_fraction)
    rng = np.random.default_rng(seed)
    pilot = max(1000, int(pilot_fraction * trials))
    pilot_null = _scores(pair, rng, pilot, rounds, False, chunk)
    pilot_alt = _scores(pair, rng, pilot, rounds, True, chunk)
    null = _scores(pair, rng, trials, rounds, False, chunk)
    alt = _scores(pair, rng, trials, rounds, True, chunk)
    return score_audit(
        null,
        alt,
        delta=delta,
        confidence=confidence,
        pilot_null=pilot_null,
        pilot_alt=pilot_alt,
    )
