"""A lower bound on random participation's per-round delta: a configuration search."""

from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import optimize, stats

from dpfl._validate import (
    check_count,
    check_nonnegative,
    check_positive,
)
from dpfl.accounting import hockey as _hockey
from dpfl.accounting.participation import _check_scheme, _round_delta
from dpfl.accounting.rp_labels import _binomial_weights

__all__ = ["configuration_search_lower_bound"]


_GL_X, _GL_W = np.polynomial.legendre.leggauss(16)


def _hockey_2d(
    means: np.ndarray,
    weights_p: np.ndarray,
    weights_q: np.ndarray,
    eps: float,
    sigma: float,
    panels: int = 10,
) -> float:
    """``D_{e^eps}(P || Q)`` for 2-D Gaussian mixtures with covariance sigma^2 I.

    Exact in the first coordinate (all roots, :mod:`pld`), composite 16-point
    Gauss-Legendre in the second over ``[min - 12 sigma, max + 12 sigma]``.
    """
    u = means[:, 0]
    v = means[:, 1]
    order = np.argsort(u, kind="stable")
    u, v = u[order], v[order]
    a0, b0 = weights_p[order], weights_q[order]
    # merge equal first coordinates per quadrature node by keeping columns
    # separate is not allowed (distinct means required): group them.
    uniq, inv = np.unique(np.round(u, 12), return_inverse=True)
    lo, hi = v.min() - 12 * sigma, v.max() + 12 * sigma
    edges = np.linspace(lo, hi, panels + 1)
    mid = 0.5 * (edges[1:] + edges[:-1])
    half = 0.5 * (edges[1:] - edges[:-1])
    nodes = (mid[:, None] + half[:, None] * _GL_X[None, :]).ravel()
    wts = (half[:, None] * _GL_W[None, :]).ravel()
    dens = stats.norm.pdf(nodes[:, None], loc=v[None, :], scale=sigma)  # (n, K)
    a = np.zeros((nodes.size, uniq.size))
    b = np.zeros((nodes.size, uniq.size))
    for col in range(u.size):
        a[:, inv[col]] += a0[col] * dens[:, col]
        b[:, inv[col]] += b0[col] * dens[:, col]
    m = np.broadcast_to(uniq, a.shape)
    dl, _, _, _ = _hockey._hockey_rows(  # pylint: disable=protected-access
        m, a, b, a - b, np.full(nodes.size, eps), sigma
    )
    return float(np.dot(wts, dl))


def _configuration_delta(
    theta: float, radius: float, eps: float, p: float, q: float, d: int, sigma: float
) -> float:
    """Delta of the real mechanism for one configuration of gradients.

    Every companion has gradient ``radius * (cos theta, sin theta)``; the
    target record has ``(1, 0)``.
    """
    # companions' counts below 1e-17 relative weight change delta by less
    # than 1e-17 (this is a lower bound: dropping them is harmless)
    idx, w, _ = _binomial_weights(d, q, cut=1e-17)
    w = w / w.sum()
    g = radius * np.array([math.cos(theta), math.sin(theta)])
    base = idx[:, None] * g[None, :]
    means = np.concatenate([[[0.0, 0.0]], base, base + [1.0, 0.0]])
    wp = np.concatenate([[1 - p], p * (1 - q) * w, p * q * w])
    wq = np.concatenate([[1 - p], p * w, 0 * w])
    rem = _hockey_2d(means, wp, wq, eps, sigma)
    add = _hockey_2d(means, wq, wp, eps, sigma)
    return max(rem, add)


def configuration_search_lower_bound(
    *,
    participation_probability: float,
    record_probability: float,
    records_per_client: int,
    noise_multiplier: float,
    epsilon: float,
    angles: int = 13,
    radii: int = 5,
    refine: bool = True,
) -> float:
    """Per-round delta lower bound from the worst of a set of gradient configurations.

    Every companion record of the neighbouring client gets the same gradient
    ``r (cos t, sin t)`` (``0 <= r <= 1``, angle ``t`` to the target record's
    unit gradient); the real mechanism's output pair (no labels, nothing
    given to the adversary) is then a pair of 2-D Gaussian mixtures, whose
    hockey-stick divergence is integrated exactly along the target direction
    and by Gauss-Legendre quadrature across it. Any configuration is a valid
    instance, so the maximum over the grid (refined locally) is a lower bound
    on the true worst-case per-round delta. ``r = 0`` is CS; ``t = 0, r = 1``
    is the collinear pair of Theorem 4.1.

    Parameters
    ----------
    participation_probability, record_probability, records_per_client, \
noise_multiplier
        As in :func:`round_delta`.
    epsilon : float
        Per-round epsilon (>= 0).
    angles, radii : int, optional
        Grid sizes of the search over ``t in [0, pi]`` and ``r in (0, 1]``.
    refine : bool, optional
        Polish the best grid point with Nelder-Mead (slower, tighter).

    Returns
    -------
    float
        The largest delta found (a lower bound on the worst case).

    Raises
    ------
    InvalidParameterError
        If a parameter is out of range.
    """
    p, q, d, _ = _check_scheme(
        participation_probability, record_probability, records_per_client, "sound"
    )
    sigma = check_positive("noise_multiplier", noise_multiplier)
    eps = check_nonnegative("epsilon", epsilon)
    check_count("angles", angles, minimum=2)
    check_count("radii", radii, minimum=1)
    best = _round_delta(eps, "cs", p, q, d, sigma)  # r = 0
    best_t, best_r = 0.0, 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for t in np.linspace(0.0, math.pi, angles):
            for r in np.linspace(1.0 / radii, 1.0, radii):
                val = _configuration_delta(float(t), float(r), eps, p, q, d, sigma)
                if val > best:
                    best, best_t, best_r = val, float(t), float(r)
        if refine and best_r > 0:
            res = optimize.minimize(
                lambda x: (
                    -_configuration_delta(
                        float(np.clip(x[0], 0, math.pi)),
                        float(np.clip(x[1], 1e-6, 1.0)),
                        eps,
                        p,
                        q,
                        d,
                        sigma,
                    )
                ),
                x0=[best_t, best_r],
                method="Nelder-Mead",
                options={"xatol": 1e-4, "fatol": 1e-3 * best, "maxiter": 200},
            )
            best = max(best, -float(res.fun))
    return float(best)
