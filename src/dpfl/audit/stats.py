"""From a distinguishing test's error rates to a lower bound on ε, with confidence.

If a mechanism ``M`` is (ε, δ)-DP, every test that tells ``M(D)`` from
``M(D')`` by rejecting on a set ``R`` has false-positive rate
``α = P[M(D) ∈ R]`` and false-negative rate ``β = P[M(D') ∉ R]`` with

    1 − β ≤ e^ε α + δ   and   1 − α ≤ e^ε β + δ,

so ``ε ≥ max(ln((1 − δ − β) / α), ln((1 − δ − α) / β))``. An audit observes
``α`` and ``β`` only through finitely many trials; it replaces them by exact
one-sided Clopper–Pearson upper bounds, each at level ``1 − γ/2``, so the
reported ε lower bound holds with probability at least ``1 − γ`` (a union
bound; no normal approximation). The threshold of a score test is chosen on
separate pilot trials, never on the trials that are counted.

References
----------
Clopper & Pearson (1934), Biometrika 26(4); Jagielski, Ullman & Oprea (2020),
"Auditing differentially private machine learning", NeurIPS.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import stats

from dpfl._validate import check_count, check_delta, check_probability
from dpfl.errors import InvalidParameterError

__all__ = [
    "AuditResult",
    "clopper_pearson_upper",
    "epsilon_from_counts",
    "epsilon_from_rates",
    "score_audit",
]


def clopper_pearson_upper(successes: int, trials: int, confidence: float) -> float:
    """Exact one-sided upper confidence bound of a binomial rate.

    Parameters
    ----------
    successes, trials : int
        Observed successes out of ``trials`` (>= 1).
    confidence : float
        Probability in (0, 1) that the true rate is at most the bound.

    Returns
    -------
    float
        The Clopper–Pearson upper bound (1 when every trial succeeded).

    Examples
    --------
    >>> round(clopper_pearson_upper(0, 100, 0.95), 4)  # the "rule of three"
    0.0295
    """
    trials = check_count("trials", trials, minimum=1)
    successes = check_count("successes", successes, minimum=0)
    if successes > trials:
        raise InvalidParameterError(
            f"successes must be <= trials ({trials}); got {successes}"
        )
    confidence = _check_confidence(confidence)
    if successes == trials:
        return 1.0
    return float(stats.beta.ppf(confidence, successes + 1, trials - successes))


def epsilon_from_rates(alpha: float, beta: float, delta: float) -> float:
    """The ε that (α, β) forces at δ: ``max`` of the two ratios, at least 0."""
    best = 0.0
    for a, b in ((alpha, beta), (beta, alpha)):
        top = 1.0 - delta - b
        if top > 0 and a > 0:
            best = max(best, math.log(top / a))
        elif top > 0:
            return math.inf
    return best


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """An empirical lower bound on ε and how it was obtained.

    Attributes
    ----------
    epsilon : float
        The lower bound on ε at ``delta`` (holds with probability >= ``confidence``).
    delta : float
        The δ it is for.
    confidence : float
        Probability that the bound is correct (over the audit's randomness).
    false_positives, negatives_trials : int
        Test rejections on ``D`` (the null) out of that many trials.
    false_negatives, positives_trials : int
        Test acceptances on ``D'`` (the alternative) out of that many trials.
    threshold : float
        The score threshold of the test (reject when the score exceeds it).
    point_estimate : float
        ε from the observed rates themselves (no confidence; for reading only).
    """

    epsilon: float
    delta: float
    confidence: float
    false_positives: int
    negatives_trials: int
    false_negatives: int
    positives_trials: int
    threshold: float
    point_estimate: float

    def to_dict(self) -> dict[str, float]:
        """Plain data (JSON ready)."""
        return dataclasses.asdict(self)


def epsilon_from_counts(
    false_positives: int,
    negatives_trials: int,
    false_negatives: int,
    positives_trials: int,
    *,
    delta: float,
    confidence: float = 0.95,
) -> float:
    """The ε lower bound, at ``confidence``, from a test's error counts.

    Each error rate is replaced by its Clopper–Pearson upper bound at level
    ``1 − (1 − confidence)/2``.

    Examples
    --------
    >>> round(epsilon_from_counts(0, 10**6, 10**5, 10**6, delta=1e-5), 2)
    12.4
    """
    delta = check_delta("delta", delta)
    confidence = _check_confidence(confidence)
    each = 1.0 - (1.0 - confidence) / 2.0
    alpha = clopper_pearson_upper(false_positives, negatives_trials, each)
    beta = clopper_pearson_upper(false_negatives, positives_trials, each)
    return epsilon_from_rates(alpha, beta, delta)


def score_audit(
    null_scores: np.ndarray,
    alt_scores: np.ndarray,
    *,
    delta: float,
    confidence: float = 0.95,
    threshold: float | None = None,
    pilot_null: np.ndarray | None = None,
    pilot_alt: np.ndarray | None = None,
) -> AuditResult:
    """Audit a score test "reject D when the score exceeds a threshold".

    Parameters
    ----------
    null_scores, alt_scores : numpy.ndarray
        Scores of independent trials on ``D`` and on ``D'`` (1-D).
    delta : float
        The δ of the bound.
    confidence : float
        Probability that the returned bound is correct.
    threshold : float, optional
        The test's threshold, fixed in advance. Otherwise it is chosen on the
        pilot scores (which must then be given, and independent of the
        counted ones) to maximise the bound there.
    pilot_null, pilot_alt : numpy.ndarray, optional
        Independent pilot trials for choosing the threshold.

    Returns
    -------
    AuditResult
        The lower bound with its counts.
    """
    null = _scores("null_scores", null_scores)
    alt = _scores("alt_scores", alt_scores)
    if threshold is None:
        if pilot_null is None or pilot_alt is None:
            raise InvalidParameterError(
                "threshold must be given, or chosen on pilot_null and pilot_alt "
                "(independent of the counted scores); got neither"
            )
        threshold = best_threshold(
            _scores("pilot_null", pilot_null),
            _scores("pilot_alt", pilot_alt),
            delta=delta,
            confidence=confidence,
        )
    fp = int(np.count_nonzero(null > threshold))
    fn = int(np.count_nonzero(alt <= threshold))
    eps = epsilon_from_counts(
        fp, null.size, fn, alt.size, delta=delta, confidence=confidence
    )
    point = epsilon_from_rates(fp / null.size, fn / alt.size, delta)
    return AuditResult(
        epsilon=eps,
        delta=delta,
        confidence=confidence,
        false_positives=fp,
        negatives_trials=null.size,
        false_negatives=fn,
        positives_trials=alt.size,
        threshold=float(threshold),
        point_estimate=point,
    )


def best_threshold(
    null: np.ndarray,
    alt: np.ndarray,
    *,
    delta: float,
    confidence: float,
    candidates: int = 256,
) -> float:
    """The threshold maximising the bound on pilot scores.

    Candidates sit just below the ``k`` largest scores of either sample for
    ``k`` on a geometric grid, so a test may reject on a rare tail event (the
    distinguishing event of a subsampled mechanism has probability ~ its
    sampling rate) as well as on a frequent one.
    """
    grid = [np.empty(0)]
    for sample in (alt, null):
        desc = np.sort(sample)[::-1]
        ks = np.unique(np.geomspace(1, desc.size, candidates).astype(np.int64))
        grid.append(desc[np.minimum(ks, desc.size - 1)])
    thresholds = np.unique(np.concatenate(grid))
    sorted_null, sorted_alt = np.sort(null), np.sort(alt)
    fps = null.size - np.searchsorted(sorted_null, thresholds, side="right")
    fns = np.searchsorted(sorted_alt, thresholds, side="right")
    bounds = [
        epsilon_from_counts(
            int(a), null.size, int(b), alt.size, delta=delta, confidence=confidence
        )
        for a, b in zip(fps, fns)
    ]
    return float(thresholds[int(np.argmax(bounds))])


def _scores(name: str, values: np.ndarray) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if arr.size == 0:
        raise InvalidParameterError(f"{name} must hold at least one score; got none")
    if not np.all(np.isfinite(arr)):
        raise InvalidParameterError(f"{name} must be finite; got NaN or Inf")
    return arr


def _check_confidence(confidence: float) -> float:
    c = check_probability("confidence", confidence)
    if not 0.0 < c < 1.0:
        raise InvalidParameterError(f"confidence must be in (0, 1); got {confidence!r}")
    return c
