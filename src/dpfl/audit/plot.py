"""The trade-off figure of a training audit (matplotlib, PNG and PDF).

The empirical (FPR, FNR) points of the audit's score test, with their
Clopper–Pearson intervals, over the trade-off curve that the claimed (ε, δ)
guarantee allows, ``β ≥ max(0, 1 − δ − e^ε α, e^{−ε}(1 − δ − α))`` (Kairouz,
Oh & Viswanath 2015, Theorem 2.1), and, where the audited mechanism is a
Gaussian (every canary in every round), its Gaussian-DP curve
``G_μ(α) = Φ(Φ⁻¹(1 − α) − μ)`` (Dong, Roth & Su 2022, Definition 2.7) with
``μ = (a₁ − a₀) √T / σ``. A point below a curve would refute that claim (up to
its interval). For a subsampled canary (add/remove) the dashed curve is the
exact trade-off of the audited pair itself, the T-fold composition of the
Poisson-subsampled Gaussian (dpfl's PLD, symmetrised over add and remove):
the best any test of these canaries can do.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from scipy import special

from dpfl.audit.training import TrainingAudit

__all__ = ["eps_delta_tradeoff", "plot_tradeoff"]


def eps_delta_tradeoff(alpha: np.ndarray, epsilon: float, delta: float) -> np.ndarray:
    """The least FNR an (ε, δ)-DP mechanism allows at FPR ``alpha``."""
    a = np.asarray(alpha, dtype=np.float64)
    e = math.exp(min(epsilon, 700.0))
    return np.maximum.reduce(
        [np.zeros_like(a), 1.0 - delta - e * a, (1.0 - delta - a) / e]
    )


def plot_tradeoff(audit: TrainingAudit, path: str | Path) -> list[Path]:
    """Write the audit's trade-off figure as ``path``.png and ``path``.pdf.

    Parameters
    ----------
    audit : TrainingAudit
        The audit (its points, reported ε, δ, rate, σ, rounds).
    path : str or Path
        Output path without (or with) suffix.

    Returns
    -------
    list of Path
        The PNG and PDF written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base = Path(path)
    base = base.with_suffix("") if base.suffix in (".png", ".pdf") else base
    base.parent.mkdir(parents=True, exist_ok=True)
    alpha = np.geomspace(1e-6, 1.0, 400)
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    ax.plot(
        alpha,
        eps_delta_tradeoff(alpha, audit.reported_epsilon, audit.delta),
        color="C3",
        label=f"claimed ({audit.reported_epsilon:.3g}, {audit.delta:g})-DP",
    )
    ax.plot(
        alpha,
        eps_delta_tradeoff(alpha, audit.epsilon, audit.delta),
        color="C0",
        ls=":",
        label=f"audit lower bound ε ≥ {audit.epsilon:.3g}",
    )
    if audit.rate >= 1.0:
        mu = (1.0 - audit.out_value) * math.sqrt(audit.rounds) / audit.noise_multiplier
        g = special.ndtr(special.ndtri(1.0 - alpha) - mu)
        ax.plot(alpha, g, color="C2", ls="--", label=f"Gaussian DP, μ = {mu:.3g}")
    elif audit.out_value == 0.0:
        from dpfl.accounting.fdp import tradeoff_from_deltas
        from dpfl.accounting.subsampled import subsampled_gaussian_pld

        pld = subsampled_gaussian_pld(
            noise_multiplier=audit.noise_multiplier,
            sampling_probability=audit.rate,
            value_discretization=1e-2,
        ).self_compose(audit.rounds)
        ax.plot(
            alpha,
            tradeoff_from_deltas(alpha, pld),
            color="C2",
            ls="--",
            label=f"canary's exact pair (rate {audit.rate:.3g}, T = {audit.rounds})",
        )
    # A zero count has no place on log axes; its interval is in the JSON.
    pts = [p for p in audit.points if p.fpr > 0 and p.fnr > 0]
    if pts:
        x = np.array([p.fpr for p in pts])
        y = np.array([p.fnr for p in pts])
        xerr = np.array(
            [[p.fpr - p.fpr_low for p in pts], [p.fpr_high - p.fpr for p in pts]]
        )
        yerr = np.array(
            [[p.fnr - p.fnr_low for p in pts], [p.fnr_high - p.fnr for p in pts]]
        )
        ax.errorbar(
            x,
            y,
            xerr=xerr,
            yerr=yerr,
            fmt="o",
            ms=3,
            color="k",
            capsize=2,
            label=f"empirical ({int(audit.confidence * 100)}% CP)",
        )
    # Log axes: the claim bites in the tails (small α or small β).
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(1e-5, 1)
    ax.set_ylim(1e-5, 1)
    ax.set_xlabel("false-positive rate α")
    ax.set_ylabel("false-negative rate β")
    ax.set_title(
        f"{audit.algorithm} ({audit.level}), {audit.threat}, {audit.protocol}",
        fontsize=9,
    )
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    out = [base.with_suffix(".png"), base.with_suffix(".pdf")]
    for p in out:
        fig.savefig(p, dpi=150)
    plt.close(fig)
    return out
