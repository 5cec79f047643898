"""MS-PAFL accounting: random check-in, data subsampling, local and global totals.

The formulas of Li, Wang, Tian, Wang and Su (MS-PAFL, arXiv 2509.25906) as
reconstructed in docs/analyses.md, next to dpfl's sound replacements (docs/analyses.md):

* :func:`lemma1_sigma`, :func:`subsampling_ratio`, :func:`amplified` — Lemma 1
  and Theorem 1 (the per-round local guarantee and its γ amplification);
* :func:`local_total_moments` — Theorem 3 (moments accountant) with the
  validity conditions of Abadi et al. Lemma 3 reported, not assumed;
* :func:`sound_client` — the rigorous default of docs/analyses.md: no γ or p
  amplification against the parameter server, exact Gaussian composition;
* :func:`pld_subsampled_local` — docs/analyses.md: the exact privacy-loss
  distribution of C_γ(G_{2C/σ}) composed over the rounds joined.

The paper's guarantees for parties that see the global public model only
(Theorems 2 and 4) are in :mod:`dpfl.accounting.checkin_global`.

A run's guarantee from its ledger (the sound figure beside the paper's
Theorems 2-4) is :func:`dpfl.accounting.reports.ms_pafl_report`.

Units and sign conventions
--------------------------
``noise_multiplier`` is the noise standard deviation in units of the clip
norm: the Gaussian added to the clipped public submodel has std
``σ = noise_multiplier * clip``.  The public submodel is clipped *itself*, so
its replace-one sensitivity is Δ = 2C and one release is μ0 = 2C/σ =
2/noise_multiplier GDP; ``clip`` therefore cancels from every privacy number
and is accepted so that reports can state σ in model units.
"""

from __future__ import annotations

import math
from typing import Any

from dpfl._validate import (
    check_count,
    check_delta,
    check_nonnegative,
    check_positive,
    check_probability,
)
from dpfl.accounting import costs, gaussian, pricing, subsampled
from dpfl.accounting import events as ev
from dpfl.accounting._quiet import quiet
from dpfl.errors import InvalidParameterError

__all__ = [
    "amplified",
    "lemma1_sigma",
    "local_total_moments",
    "pld_subsampled_local",
    "sound_client",
    "subsampling_ratio",
]

_SERVER = "the parameter server (sees every noisy public submodel and who checked in)"


# ---------------------------------------------------------------------------
# Lemma 1 and Theorem 1
# ---------------------------------------------------------------------------
def lemma1_sigma(
    *, epsilon: float, delta: float, sensitivity: float, allow_invalid: bool = False
) -> float:
    """Noise std of the classic Gaussian mechanism (MS-PAFL Lemma 1).

    σ = sqrt(2 ln(1.25/δ)) Δ / ε, which gives (ε, δ)-DP only for 0 < ε < 1.

    Parameters
    ----------
    epsilon : float
        Target ε in (0, 1).
    delta : float
        Target δ in (0, 1).
    sensitivity : float
        L2 sensitivity Δ > 0 (MS-PAFL: Δ = 2C, docs/analyses.md).
    allow_invalid : bool, optional
        If True, return the formula's value for ε >= 1 as well (the paper's
        number; it is *not* a valid guarantee there).  Default False.

    Returns
    -------
    float
        The noise standard deviation σ.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain, or ε >= 1 and not
        ``allow_invalid`` (calibrate with the analytic Gaussian mechanism or
        GDP instead, docs/analyses.md).

    References
    ----------
    Dwork & Roth (2014), Theorem 3.22; MS-PAFL eq. 6-7.
    """
    eps = check_positive("epsilon", epsilon)
    dlt = check_delta("delta", delta)
    sens = check_positive("sensitivity", sensitivity)
    if eps >= 1 and not allow_invalid:
        raise InvalidParameterError(
            "epsilon must be < 1 for the classic Gaussian formula (Lemma 1); got "
            f"{epsilon!r}. Use the analytic Gaussian mechanism or GDP calibration."
        )
    return math.sqrt(2.0 * math.log(1.25 / dlt)) * sens / eps


def subsampling_ratio(
    *, batch_size: int, dataset_size: int, replacement: bool, local_steps: int = 1
) -> float:
    """Return the data subsampling ratio γ of MS-PAFL Theorem 1 (docs/analyses.md).

    One size-b batch from n records: γ_WOR = b/n, γ_WR = 1 - (1 - 1/n)^b, the
    probability that a given record is drawn at all (γ_WR < γ_WOR for b >= 2,
    Remark 2).  With E local steps of independent batches the record is
    touched if any step draws it: γ = 1 - (1 - b/n)^E (WOR) and
    γ = 1 - (1 - 1/n)^{bE} (WR).

    Parameters
    ----------
    batch_size : int
        Batch size b >= 1 (b <= n without replacement).
    dataset_size : int
        Local dataset size n >= 1.
    replacement : bool
        True for sampling with replacement (WR), False without (WOR).
    local_steps : int, optional
        Number E >= 1 of local steps, each with a fresh batch.  Default 1.

    Returns
    -------
    float
        γ in (0, 1].

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    MS-PAFL eq. 11 and Remark 2; Balle, Barthe & Gaboardi (2018), Thms 9-10.
    """
    n = check_count("dataset_size", dataset_size, minimum=1)
    b = check_count("batch_size", batch_size, minimum=1)
    steps = check_count("local_steps", local_steps, minimum=1)
    if replacement:
        return float(-math.expm1(b * steps * math.log1p(-1.0 / n))) if n > 1 else 1.0
    if b > n:
        raise InvalidParameterError(
            f"batch_size must be <= dataset_size without replacement; got {b} > {n}"
        )
    if b == n:
        return 1.0
    return float(-math.expm1(steps * math.log1p(-b / n)))


def amplified(*, epsilon: float, delta: float, gamma: float) -> tuple[float, float]:
    """Amplification by subsampling (MS-PAFL Theorem 1).

    ε' = ln(1 + γ(e^ε - 1)), δ' = γ δ.

    Parameters
    ----------
    epsilon : float
        ε >= 0 of the mechanism run on the subsample.
    delta : float
        δ in [0, 1] of that mechanism.
    gamma : float
        Subsampling ratio γ in (0, 1] (see :func:`subsampling_ratio`).

    Returns
    -------
    tuple of float
        ``(epsilon_amplified, delta_amplified)``.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    Balle, Barthe & Gaboardi (2018), "Privacy amplification by subsampling";
    MS-PAFL eq. 11.
    """
    eps = check_nonnegative("epsilon", epsilon)
    dlt = check_probability("delta", delta, allow_zero=True)
    g = check_probability("gamma", gamma)
    return float(math.log1p(g * math.expm1(eps))), g * dlt


# ---------------------------------------------------------------------------
# Theorem 3 (local totals) and the sound replacements
# ---------------------------------------------------------------------------
def local_total_moments(
    *,
    probability: float,
    rounds: int,
    gamma: float,
    noise_multiplier: float,
    clip: float,
    delta: float,
) -> dict[str, Any]:
    """Total loss of one client over R rounds by the moments accountant (Thm 3).

    A = p R γ² Δ² / ((1-γ) σ²) with Δ = 2C, σ = ``noise_multiplier * clip``;
    ε = A + 2 sqrt(A ln(1/δ)), attained at λ* = (ε - A)/(2A).

    The closed form rests on Abadi et al.'s Lemma 3 bound on the log moment,
    which holds only when σ/Δ >= 1, γ < 1/(16 σ/Δ) and
    λ* <= (σ/Δ)² ln(1/(γ σ/Δ)); the three are reported, and ``valid`` is their
    conjunction.  They usually fail for MS-PAFL's parameters (docs/analyses.md);
    :func:`pld_subsampled_local` is the exact alternative.  p R is the expected
    number of rounds joined, not a bound on the realised one, and the γ
    amplification itself is unsound while the private submodel persists
    across rounds (see :func:`sound_client`).

    Parameters
    ----------
    probability : float
        Check-in probability p_k in (0, 1].
    rounds : int
        Number of rounds R >= 1.
    gamma : float
        Data subsampling ratio γ in (0, 1).
    noise_multiplier : float
        Noise std in units of the clip norm (σ = noise_multiplier · C), > 0.
    clip : float
        Clip norm C > 0 of the public submodel.
    delta : float
        Target δ in (0, 1).

    Returns
    -------
    dict
        ``epsilon`` (A + 2 sqrt(A ln 1/δ)), ``epsilon_quadratic_only``
        (2 sqrt(A ln 1/δ), the λ²-only form), ``A``, ``lambda_star``, the
        conditions ``sigma_over_sensitivity_ge_1``, ``gamma_lt_1_over_16z``,
        ``lambda_within_range``, ``valid``, and the guarantee's terms
        (``unit``, ``neighbouring``, ``adversary``, ``analysis``).

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    MS-PAFL Theorem 3, App. C (eq. C.2-C.9); Abadi et al. (2016), Lemma 3 and
    Theorem 2.
    """
    p = check_probability("probability", probability)
    r = check_count("rounds", rounds, minimum=1)
    g = check_probability("gamma", gamma, allow_one=False)
    z = check_positive("noise_multiplier", noise_multiplier)
    c = check_positive("clip", clip)
    dlt = check_delta("delta", delta)
    sigma = z * c
    sens = 2.0 * c
    z_eff = sigma / sens  # σ/Δ, Abadi's noise multiplier
    a = p * r * g * g * sens * sens / ((1.0 - g) * sigma * sigma)
    log_inv_delta = math.log(1.0 / dlt)
    eps = a + 2.0 * math.sqrt(a * log_inv_delta)
    lam = (eps - a) / (2.0 * a)
    cond_sigma = z_eff >= 1.0
    cond_gamma = g < 1.0 / (16.0 * z_eff)
    lam_max = z_eff * z_eff * math.log(1.0 / (g * z_eff)) if g * z_eff < 1 else 0.0
    cond_lambda = lam <= lam_max
    return {
        "epsilon": eps,
        "epsilon_quadratic_only": 2.0 * math.sqrt(a * log_inv_delta),
        "delta": dlt,
        "A": a,
        "lambda_star": lam,
        "lambda_max": lam_max,
        "noise_std": sigma,
        "sigma_over_sensitivity_ge_1": cond_sigma,
        "gamma_lt_1_over_16z": cond_gamma,
        "lambda_within_range": cond_lambda,
        "valid": bool(cond_sigma and cond_gamma and cond_lambda),
        "unit": "record",
        "neighbouring": "replace-one",
        "adversary": _SERVER,
        "analysis": "paper (MS-PAFL Theorem 3, moments accountant)",
    }


def sound_client(
    *, noise_multiplier: float, clip: float, rounds_joined: int, delta: float
) -> dict[str, Any]:
    """Sound total for one client against the parameter server (docs/analyses.md).

    Each joined round releases the clipped public submodel plus N(0, σ² I),
    σ = ``noise_multiplier * clip``; any change of the client's data (one record
    or all of them, replace-one) moves it by at most Δ = 2C, so one round is
    μ0 = 2C/σ GDP and N rounds compose exactly to μ = μ0 sqrt(N) GDP, converted
    to (ε, δ) with the GDP curve.  No amplification is claimed: the server sees
    each upload and who checked in, and the private submodel carries earlier
    subsamples into later rounds, so neither p nor γ may be used.

    Parameters
    ----------
    noise_multiplier : float
        Noise std in units of the clip norm, > 0.
    clip : float
        Clip norm C > 0 of the public submodel.
    rounds_joined : int
        Number N_k >= 0 of rounds the client actually joined.
    delta : float
        Target δ in (0, 1).

    Returns
    -------
    dict
        ``mu_round``, ``mu`` (total GDP μ), ``epsilon`` (at ``delta``),
        ``delta``, ``noise_std`` and the guarantee's terms.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    Dong, Roth & Su (2022), Corollary 2.13 and Corollary 3.3; docs/analyses.md
    """
    z = check_positive("noise_multiplier", noise_multiplier)
    c = check_positive("clip", clip)
    n = check_count("rounds_joined", rounds_joined, minimum=0)
    dlt = check_delta("delta", delta)
    sigma = z * c
    mu0 = 2.0 * c / sigma
    mu = mu0 * math.sqrt(n)
    return {
        "mu_round": mu0,
        "mu": mu,
        "epsilon": gaussian.gdp_epsilon(dlt, mu=mu),
        "delta": dlt,
        "noise_std": sigma,
        "rounds_joined": n,
        "unit": "record and client",
        "neighbouring": "replace-one",
        "adversary": _SERVER,
        "analysis": "sound (exact Gaussian composition, no amplification)",
    }


def pld_subsampled_local(
    *,
    gamma: float,
    noise_multiplier: float,
    clip: float,
    rounds_joined: int,
    delta: float,
    value_discretization_interval: float = 1e-4,
) -> float:
    """Exact local total of Theorem 3's setting by privacy-loss distributions.

    Each joined round is the WOR-subsampled Gaussian C_γ(G_{2C/σ}) (replace-one,
    symmetrised *before* composing, docs/analyses.md); its pessimistic PLD is composed
    N_k times and converted to ε at ``delta``.  This is the exact version of
    :func:`local_total_moments` — and carries the same caveat that γ
    amplification needs the private submodel to be reset or noised
    (docs/analyses.md); without that, :func:`sound_client` is the valid bound.

    Parameters
    ----------
    gamma : float
        Data subsampling ratio γ in (0, 1].
    noise_multiplier : float
        Noise std in units of the clip norm, > 0.
    clip : float
        Clip norm C > 0 (cancels: μ0 = 2/noise_multiplier).
    rounds_joined : int
        Number N_k >= 1 of rounds joined.
    delta : float
        Target δ in (0, 1).
    value_discretization_interval : float, optional
        Grid step h of the privacy loss.  Default 1e-4.

    Returns
    -------
    float
        An upper bound on ε (pessimistic discretisation).

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    Notes
    -----
    the reference example "ε 0.154 vs formula 0.333 at pR = 20 rounds" is
    reproduced by ε_local = 0.5, δ = 1e-5 (both for Lemma 1's σ and for the
    total), Δ = 2C so noise_multiplier = 2 sqrt(2 ln(1.25e5))/0.5 = 19.38,
    γ = 0.1, 20 rounds joined: this function gives 0.1543 and Theorem 3's
    closed form 0.3325 (see notes/checkin.md).

    References
    ----------
    Dong, Roth & Su (2022), subsampling theorem; Doroshenko et al. (2022),
    "Connect the dots"; docs/analyses.md and §3.3.
    """
    g = check_probability("gamma", gamma)
    z = check_positive("noise_multiplier", noise_multiplier)
    check_positive("clip", clip)
    n = check_count("rounds_joined", rounds_joined, minimum=1)
    dlt = check_delta("delta", delta)
    h = check_positive("value_discretization_interval", value_discretization_interval)
    mu0 = 2.0 / z
    one = subsampled.subsampled_gaussian_pld(
        noise_multiplier=1.0 / mu0, sampling_probability=g, value_discretization=h
    )
    with quiet():
        composed = one.self_compose(n) if n > 1 else one
        return float(composed.get_epsilon_for_delta(dlt))


# -- the price of a CheckIn round (registered with the Accountant) -------------
@pricing.prices(ev.CheckIn)
def _price_check_in(
    event: ev.CheckIn, *, analysis: str, discretization: float
) -> pricing.PldPair:
    if analysis == "paper":
        # The paper's amplification by the check-in probability: every round's
        # replace-one release Poisson(p)-subsampled (not a valid bound).
        cost, _ = costs.participant_costs(event)["participant"]
        return pricing.poisson_of_gaussian(event.probability, cost, discretization)
    # The server sees who checked in: w.p. p the full release, else nothing.
    return pricing.public_mixture(
        pricing.exclusive(costs.participant_costs(event)), "exact", discretization
    )
