"""Exact accounting of public-label mixtures of Gaussian mechanisms.

A round of a check-in or two-stage scheme releases, with public probability
``w_r``, a Gaussian mechanism of Gaussian-DP parameter ``mu_r`` (role ``r``;
with the remaining probability nothing), and the adversary sees the role.
Conditioned on every round's role, the releases are Gaussian mechanisms, whose
composition is exactly ``mu``-GDP with ``mu^2`` the sum of their ``mu_r^2``
(Dong, Roth & Su 2022, Corollary 3.3), in both directions. The roles are
public and do not depend on the data, so the composed pair is the mixture,
over the role counts, of those Gaussian pairs, and its hockey-stick curve is
the mixture of theirs:

    delta(eps) = sum_m P(m) delta_GDP(eps; sqrt(mu2(m))),

with ``m`` the role counts (multinomial per event type, independent across
types) and ``mu2(m) = sum_r m_r mu_r^2`` plus the ``mu^2`` of plain Gaussian
rounds. :class:`GdpMixture` sums it exactly: the multinomial is enumerated as
a chain of binomials, ``m_r ~ Binom(n - m_1 - ... - m_{r-1}, w_r / (1 - w_1 -
... - w_{r-1}))``, each over the counts of probability at least ``1e-40``, and
the probability of the counts left out is computed from binomial tails (not
as ``1 - sum``) and added to the upper ``delta`` as if those counts leaked
everything. Weights are ``scipy.stats.binom.logpmf`` (relative error below
``1e-13``), ``delta_GDP`` is the log-space closed form of
:mod:`dpfl.accounting.gaussian` (about ``1e-13``); the bracket allows
:data:`RTOL` ``= 1e-9`` relative in ``delta`` on each side.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize, special, stats

from dpfl.accounting.bounds import Bound

__all__ = ["RTOL", "GdpMixture", "log_gdp_delta"]

#: Relative accuracy allowed for the computed delta of a mixture (weights and
#: closed forms together), on each side of the bracket.
RTOL = 1e-9

#: Binomial tail left out of the enumeration on each side of every count.
_TAIL = 1e-40

_SQRT2 = math.sqrt(2.0)


def log_gdp_delta(epsilon: float, mu: np.ndarray) -> np.ndarray:
    """``log delta(eps)`` of ``mu``-GDP for an array of ``mu > 0`` (vectorised).

    The log-space closed form of :func:`dpfl.accounting.gaussian.gdp_delta`:
    with ``a = mu/2 - eps/mu`` and ``b = a - mu``, ``delta = Phi(a) - e^eps
    Phi(b)``, evaluated as ``e^{-a^2/2} (erfcx(-a/sqrt2) - erfcx(-b/sqrt2))/2``
    for ``a < 0`` (no cancellation of two tiny numbers) and directly
    otherwise.
    """
    mu = np.asarray(mu, dtype=float)
    a = mu / 2.0 - epsilon / mu
    b = a - mu
    out = np.full(mu.shape, -np.inf)
    neg = a < 0.0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if neg.any():
            an, bn = a[neg], b[neg]
            diff = special.erfcx(-an / _SQRT2) - special.erfcx(-bn / _SQRT2)
            out[neg] = np.where(
                diff > 0,
                -0.5 * an * an + np.log(0.5 * np.maximum(diff, 1e-300)),
                -np.inf,
            )
        pos = ~neg
        if pos.any():
            first = special.log_ndtr(a[pos])
            second = epsilon + special.log_ndtr(b[pos])
            d = second - first
            out[pos] = np.where(
                d < 0, first + np.log(-np.expm1(np.minimum(d, -1e-300))), -np.inf
            )
    return out


def _binomial_window(n: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Counts ``[lo, hi]`` of ``Binom(n, p)`` outside which lies less than ``1e-40``.

    Sixteen standard deviations plus 60 on each side (a Chernoff bound puts
    less than ``1e-40`` beyond), then trimmed to the counts whose probability
    is at least ``1e-40`` by the log-pmf (scipy's quantiles do not reach
    such tails). What is left out is summed from the tails, not assumed.
    """
    sd = np.sqrt(n * p * (1.0 - p))
    mean = n * p
    lo = np.maximum(np.floor(mean - 16.0 * sd - 60.0), 0.0)
    hi = np.minimum(np.ceil(mean + 16.0 * sd + 60.0), n)
    log_tail = math.log(_TAIL)
    lo_i, hi_i = lo.astype(np.int64), hi.astype(np.int64)
    for r in range(n.size):
        k = np.arange(lo_i[r], hi_i[r] + 1)
        keep = np.nonzero(stats.binom.logpmf(k, n[r], p[r]) >= log_tail)[0]
        if keep.size:
            lo_i[r], hi_i[r] = k[keep[0]], k[keep[-1]]
    return lo_i, hi_i


@dataclasses.dataclass(frozen=True)
class GdpMixture:
    """``delta(eps) = sum_t w_t delta_GDP(eps; sqrt(mu2_t)) + (left out)``.

    Attributes
    ----------
    mu2 : numpy.ndarray
        Total ``mu^2`` of each term.
    log_weight : numpy.ndarray
        Natural log of each term's probability.
    dropped : float
        Probability of the role counts left out (an upper bound).
    """

    mu2: np.ndarray
    log_weight: np.ndarray
    dropped: float

    @classmethod
    def build(
        cls,
        factors: Sequence[tuple[int, Sequence[tuple[float, float]]]],
        constant: float = 0.0,
        *,
        max_terms: int = 400_000,
    ) -> GdpMixture | None:
        """The mixture of independent event types and plain Gaussian rounds.

        Parameters
        ----------
        factors : sequence of (int, sequence of (float, float))
            Per event type: its number of rounds ``n`` and its roles
            ``(w_r, mu_r^2)`` (probabilities summing to at most 1; the rest
            releases nothing).
        constant : float, optional
            ``mu^2`` of the plain Gaussian rounds.
        max_terms : int, optional
            Give up (return None) past this many terms.

        Returns
        -------
        GdpMixture or None
            None when the enumeration would exceed ``max_terms``.
        """
        mu2 = np.array([float(constant)])
        logw = np.array([0.0])
        dropped = 0.0
        for count, roles in factors:
            f_mu2 = np.array([0.0])
            f_logw = np.array([0.0])
            f_left = np.array([int(count)], dtype=np.int64)
            covered = 0.0
            for w, m2 in roles:
                if w <= 0.0:
                    continue
                p = min(1.0, w / (1.0 - covered)) if covered < 1.0 else 1.0
                covered += w
                pp = np.full(f_left.size, p)
                lo, hi = _binomial_window(f_left.astype(float), pp)
                sizes = hi - lo + 1
                if int(np.sum(sizes)) * mu2.size > max_terms:
                    return None
                # counts left out on either side of each window
                tails = stats.binom.cdf(lo - 1, f_left, pp) + stats.binom.sf(
                    hi, f_left, pp
                )
                dropped += float(np.sum(np.exp(f_logw) * tails))
                rep = np.repeat(np.arange(f_left.size), sizes)
                k = np.concatenate(
                    [np.arange(a, b + 1) for a, b in zip(lo.tolist(), hi.tolist())]
                )
                f_logw = f_logw[rep] + stats.binom.logpmf(k, f_left[rep], p)
                f_mu2 = f_mu2[rep] + k * m2
                f_left = f_left[rep] - k
            if f_mu2.size * mu2.size > max_terms:
                return None
            mu2 = (mu2[:, None] + f_mu2[None, :]).ravel()
            logw = (logw[:, None] + f_logw[None, :]).ravel()
            keep = logw >= math.log(_TAIL)
            dropped += float(np.sum(np.exp(logw[~keep])))
            mu2, logw = mu2[keep], logw[keep]
        return cls(mu2, logw, min(dropped * (1 + 1e-9), 1.0))

    def _log_sum(self, epsilon: float) -> float:
        """``log sum_t w_t delta_GDP(eps; mu_t)`` (terms with mu = 0 add 0)."""
        pos = self.mu2 > 0.0
        if not pos.any():
            return -math.inf
        terms = self.log_weight[pos] + log_gdp_delta(epsilon, np.sqrt(self.mu2[pos]))
        top = float(np.max(terms))
        if not math.isfinite(top):
            return -math.inf
        return top + math.log(float(np.sum(np.exp(terms - top))))

    def delta_upper(self, epsilon: float) -> float:
        """A certified upper value of ``delta(eps)``."""
        return min(1.0, math.exp(self._log_sum(epsilon)) * (1 + RTOL) + self.dropped)

    def delta_lower(self, epsilon: float) -> float:
        """A certified lower value of ``delta(eps)``."""
        return math.exp(self._log_sum(epsilon)) * (1 - RTOL)

    def delta_bound(self, epsilon: float) -> Bound:
        """Bracket of ``delta(eps)``."""
        lo, hi = self.delta_lower(epsilon), self.delta_upper(epsilon)
        return Bound(lo, 0.5 * (lo + hi), hi, "gdp-mixture")

    def _root(self, fn: str, delta: float) -> float:
        """Smallest ``eps >= 0`` with ``getattr(self, fn)(eps) <= delta``, bisected."""
        f = getattr(self, fn)
        if f(0.0) <= delta:
            return 0.0
        hi = 1.0
        while f(hi) > delta:
            hi *= 2.0
            if hi > 1e7:
                return math.inf
        log_d = math.log(delta)

        def g(e: float) -> float:
            v = f(e)
            return (math.log(v) if v > 0 else -800.0) - log_d

        return float(optimize.brentq(g, 0.0, hi, xtol=1e-13 * max(1.0, hi), rtol=1e-14))

    def epsilon_bound(self, delta: float) -> Bound:
        """Bracket of the smallest ``eps`` with ``delta(eps) <= delta``.

        The upper value is moved up until the upper ``delta`` meets the
        target; the lower value down until the lower ``delta`` exceeds it, so
        both hold whatever side the root finder stopped on.
        """
        if self.dropped >= delta:
            hi = math.inf
        else:
            hi = self._root("delta_upper", delta)
            step = 1e-13 * max(1.0, hi)
            while math.isfinite(hi) and self.delta_upper(hi) > delta:
                hi += step
                step *= 2.0
        lo = self._root("delta_lower", delta)
        step = 1e-13 * max(1.0, lo)
        while lo > 0.0 and self.delta_lower(lo) <= delta:
            lo = max(0.0, lo - step)
            step *= 2.0
        lo = min(lo, hi)
        mid = 0.5 * (lo + hi) if math.isfinite(hi) else hi
        return Bound(lo, mid, hi, "gdp-mixture")
