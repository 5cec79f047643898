"""Auditing with one training run (Steinke, Nasr & Jagielski, 2023).

``m`` canaries are each included in the run independently with probability
1/2 (``S_i ∈ {−1, +1}`` uniform). From the run's output the auditor guesses
``T_i ∈ {−1, 0, +1}`` (include, abstain, exclude); with ``r`` guesses of which
``v`` are correct, Steinke, Nasr & Jagielski, "Privacy auditing with one (1)
training run" (NeurIPS 2023) bound how many can be right:

* **pure ε-DP** (their main theorem): ``W``, the number of correct guesses, is
  stochastically dominated by ``Binomial(r, p)`` with ``p = e^ε / (1 + e^ε)``
  (the accuracy of ε randomized response), so ``P[W ≥ v] ≤ P[Binomial(r, p) ≥ v]``;
* **(ε, δ)-DP** (the theorem's approximate-DP version, arXiv 2305.08846,
  evaluated as in their appendix's p-value routine)::

      P[W ≥ v] ≤ P[Bin(r, p) ≥ v] + 2 m δ · max_{1≤i≤v} P[v − i ≤ Bin(r, p) < v] / i

The right-hand side is a p-value for the hypothesis "the run is (ε, δ)-DP";
it increases with ε, and the audit's lower bound at confidence ``1 − γ`` is
the largest ε whose p-value is at most γ (every smaller ε is rejected at
level γ). Nothing is assumed about how the canaries' outputs depend on one
another: the theorem holds for any (ε, δ)-DP algorithm, which is what lets one
run replace many.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import stats

from dpfl._validate import check_count, check_nonnegative, check_probability
from dpfl.audit.stats import _check_confidence
from dpfl.errors import InvalidParameterError

__all__ = [
    "OneRunResult",
    "one_run_epsilon",
    "one_run_guesses",
    "one_run_p_value",
]


def _check_delta0(delta: float) -> float:
    """δ in [0, 1) (0: pure DP)."""
    return check_probability("delta", delta, allow_zero=True, allow_one=False)


def _counts(canaries: int, guesses: int, correct: int) -> tuple[int, int, int]:
    m = check_count("canaries", canaries, minimum=1)
    r = check_count("guesses", guesses, minimum=0)
    v = check_count("correct", correct, minimum=0)
    if not v <= r <= m:
        raise InvalidParameterError(
            f"need correct <= guesses <= canaries; got correct={v}, guesses={r}, "
            f"canaries={m}"
        )
    return m, r, v


def one_run_p_value(
    canaries: int, guesses: int, correct: int, *, epsilon: float, delta: float
) -> float:
    """P[at least ``correct`` right of ``guesses``] for an (ε, δ)-DP run, bounded.

    Parameters
    ----------
    canaries : int
        m, canaries each included w.p. 1/2.
    guesses : int
        r, guesses made (abstentions excluded).
    correct : int
        v, correct guesses.
    epsilon, delta : float
        The (ε, δ) of the hypothesis.

    Returns
    -------
    float
        The bound of Steinke, Nasr & Jagielski (2023), approximate-DP
        version (the pure-DP binomial tail when δ = 0), capped at 1.

    Examples
    --------
    >>> round(one_run_p_value(100, 10, 10, epsilon=0.0, delta=0.0), 6)  # 2^-10
    0.000977
    """
    m, r, v = _counts(canaries, guesses, correct)
    eps = check_nonnegative("epsilon", epsilon)
    delta = _check_delta0(delta)
    p = 1.0 / (1.0 + math.exp(-eps))
    if v == 0:
        return 1.0
    tail = float(stats.binom.sf(v - 1, r, p))  # P[Bin >= v]
    if delta == 0.0:
        return min(1.0, tail)
    # P[v - i <= Bin < v] = cdf(v - 1) - cdf(v - i - 1), i = 1..v
    cdf = stats.binom.cdf(np.arange(-1, v), r, p)  # cdf[k + 1] = P[Bin <= k]
    i = np.arange(1, v + 1)
    window = cdf[v] - cdf[v - i]
    extra = 2.0 * m * delta * float(np.max(window / i))
    return min(1.0, tail + extra)


def one_run_epsilon(
    canaries: int,
    guesses: int,
    correct: int,
    *,
    delta: float,
    confidence: float = 0.95,
    tolerance: float = 1e-6,
) -> float:
    """The ε lower bound at ``confidence``: the largest ε rejected at 1 − confidence.

    Parameters
    ----------
    canaries, guesses, correct : int
        m, r, v as in :func:`one_run_p_value`.
    delta : float
        δ of the bound.
    confidence : float
        Probability in (0, 1) that the bound holds.
    tolerance : float
        Absolute precision of the bisection (the value is rounded down).

    Returns
    -------
    float
        ε such that every ε' < it has p-value <= 1 − confidence (0 if none).

    Examples
    --------
    >>> e = one_run_epsilon(1000, 100, 100, delta=0.0)  # 100 of 100 right
    >>> round(e, 3)  # p^100 = 0.05: p = 0.9705, ε = ln(p/(1 − p))
    3.493
    """
    m, r, v = _counts(canaries, guesses, correct)
    delta = _check_delta0(delta)
    gamma = 1.0 - _check_confidence(confidence)

    def rejected(eps: float) -> bool:
        return one_run_p_value(m, r, v, epsilon=eps, delta=delta) <= gamma

    if not rejected(0.0):
        return 0.0
    lo, hi = 0.0, 1.0
    while rejected(hi):
        lo, hi = hi, 2.0 * hi
        if hi > 1e4:
            return math.inf
    while hi - lo > tolerance:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if rejected(mid) else (lo, mid)
    return lo


@dataclasses.dataclass(frozen=True)
class OneRunResult:
    """A one-run audit's outcome.

    Attributes
    ----------
    epsilon : float
        The lower bound (holds with probability >= ``confidence``).
    delta, confidence : float
        What it is for.
    canaries, guesses, correct : int
        m, r, v.
    guess_in, guess_out : int
        Guesses "included" (top scores) and "excluded" (bottom scores).
    """

    epsilon: float
    delta: float
    confidence: float
    canaries: int
    guesses: int
    correct: int
    guess_in: int
    guess_out: int

    def to_dict(self) -> dict[str, float]:
        """Plain data (JSON ready)."""
        return dataclasses.asdict(self)


def one_run_guesses(
    scores: np.ndarray,
    included: np.ndarray,
    *,
    guess_in: int,
    guess_out: int,
    delta: float,
    confidence: float = 0.95,
    canaries: int | None = None,
) -> OneRunResult:
    """Guess "in" for the ``guess_in`` top scores, "out" for the ``guess_out`` bottom.

    Parameters
    ----------
    scores : numpy.ndarray
        One score per audited canary (higher: more likely included).
    included : numpy.ndarray
        The canaries' true inclusion (bool), drawn w.p. 1/2 each.
    guess_in, guess_out : int
        k₊ and k₋ (their sum at most the number of canaries). They must be
        fixed without looking at ``included`` (e.g. on other canaries).
    delta, confidence : float
        δ and the confidence of the bound.
    canaries : int, optional
        m of the theorem (default: ``len(scores)``; give the run's full
        count when these canaries are a subset whose complement was used to
        choose k₊, k₋).

    Returns
    -------
    OneRunResult
        The bound and its counts.
    """
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    inc = np.asarray(included, dtype=bool).reshape(-1)
    if s.shape != inc.shape:
        raise InvalidParameterError(
            f"scores and included must have the same length; got {s.size} and "
            f"{inc.size}"
        )
    k_in = check_count("guess_in", guess_in, minimum=0)
    k_out = check_count("guess_out", guess_out, minimum=0)
    if k_in + k_out > s.size:
        raise InvalidParameterError(
            f"guess_in + guess_out must be <= the canaries ({s.size}); got "
            f"{k_in + k_out}"
        )
    order = np.argsort(s, kind="stable")
    correct = int(inc[order[s.size - k_in :]].sum()) if k_in else 0
    correct += int((~inc[order[:k_out]]).sum())
    m = s.size if canaries is None else check_count("canaries", canaries, minimum=1)
    eps = one_run_epsilon(m, k_in + k_out, correct, delta=delta, confidence=confidence)
    return OneRunResult(
        epsilon=eps,
        delta=delta,
        confidence=confidence,
        canaries=m,
        guesses=k_in + k_out,
        correct=correct,
        guess_in=k_in,
        guess_out=k_out,
    )
