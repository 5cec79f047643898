"""Random participation's ``sound`` analysis (two-sided conditional pair) by quadrature.

Everything dpfl is compared with here is computed by this file alone. One
round's output for a FIXED configuration of gradients is a pair of Gaussian
mixtures in R^k with covariance sigma^2 I, and its hockey-stick divergence

    D_{e^eps}(P || Q) = integral over R^k of (P - e^eps Q)_+

is computed by :func:`hockey`: exactly along the first axis (every root of
the one-dimensional mixture on that line is bracketed on a fine grid and
bisected, and the positive part integrated with normal CDFs), and by the
trapezoid rule over the remaining axes (spacing sigma / 8 over 8 sigma beyond
the means; the integrand is smooth and Gaussian-decaying, and halving the
spacing moves the values by less than 1e-9 relative, see
``test_quadrature_converges``).

Two layers are checked (record-level add/remove; Hasircioglu & Gündüz,
arXiv 2205.01556):

1. Per label (the set of sampled companions revealed, ``|S_1| = i``): for
   every companions' sum ``mu`` (``||mu|| <= i``) and record gradient ``g'``
   (``||g'|| <= 1``) in 2-D and 3-D, the pair
   ``W = (1-p) N(0) + p(1-q) N(mu) + pq N(mu + g')``,
   ``O = (1-p) N(0) + p N(mu)``
   has ``D(W || O)`` at most the aligned pair's (means 0, i, i+1) and
   ``D(O || W)`` at most the anti-aligned pair's (0, i, i-1), and those two
   attain it.
2. The whole mechanism with the label hidden (2-3 companions, all subsets):
   its one-round delta in each direction never exceeds dpfl's ``sound``
   round delta in that direction, and dpfl's curve equals the binomial
   mixture of the aligned (remove) and anti-aligned (add) label pairs.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import special, stats

from dpfl.accounting import participation as rp

# --------------------------------------------------------------------------
# independent quadrature
# --------------------------------------------------------------------------

_NX = 1601  # grid on the exact axis, where roots are bracketed
_REACH = 8.0  # integration reaches this many sigma beyond the means
_OUTER_STEP = 1 / 8  # trapezoid spacing over the other axes, in sigma


def _line_positive_part(c, m0, sigma, lo, hi):
    """Row-wise integral over R of (sum_j c[r, j] phi_sigma(x - m0[j]))_+.

    Roots are bracketed by sign changes on an ``_NX``-point grid over
    ``[lo, hi]`` and bisected to machine precision. With G(x) = sum_j c_j
    Phi((x - m0_j) / sigma), the positive part's integral is the sum over roots
    of +G(r) where the function turns negative and -G(r) where it turns
    positive, plus G(+inf) = sum_j c_j if it is positive beyond the last root.
    """
    xs = np.linspace(lo, hi, _NX)
    dens = stats.norm.pdf((xs[:, None] - m0[None, :]) / sigma)  # (nx, K)
    f = c @ dens.T  # (R, nx)
    pos = f > 0
    rows, cols = np.nonzero(pos[:, 1:] != pos[:, :-1])
    a, b = xs[cols], xs[cols + 1]
    ca = c[rows]
    fa = np.einsum("rk,rk->r", ca, stats.norm.pdf((a[:, None] - m0) / sigma))
    for _ in range(60):
        mid = 0.5 * (a + b)
        fm = np.einsum("rk,rk->r", ca, stats.norm.pdf((mid[:, None] - m0) / sigma))
        same = np.sign(fm) == np.sign(fa)
        a = np.where(same, mid, a)
        fa = np.where(same, fm, fa)
        b = np.where(same, b, mid)
    root = 0.5 * (a + b)
    g_root = np.einsum("rk,rk->r", ca, special.ndtr((root[:, None] - m0) / sigma))
    turns_negative = pos[rows, cols]
    out = np.zeros(c.shape[0])
    np.add.at(out, rows, np.where(turns_negative, g_root, -g_root))
    out += np.where(pos[:, -1], c.sum(axis=1), 0.0)
    return np.maximum(out, 0.0)


def _rotate(means, along):
    """Coordinates in an orthonormal basis whose first vector is ``along``."""
    k = means.shape[1]
    basis = [np.asarray(along, float) / np.linalg.norm(along)]
    for v in np.eye(k):
        r = v - sum((v @ b) * b for b in basis)
        if np.linalg.norm(r) > 1e-6 and len(basis) < k:
            basis.append(r / np.linalg.norm(r))
    return means @ np.array(basis).T


def hockey(means, wp, wq, eps, sigma, along=None):
    """``integral (P - e^eps Q)_+`` for mixtures in R^k (means: (K, k)).

    ``along`` (default: the first axis) is the direction integrated exactly:
    the record's gradient, across which the positive set's boundary runs, so
    that the boundary meets every line along it transversally and the outer
    integrand stays smooth (the isotropic noise makes any rotation exact).
    """
    means = np.atleast_2d(np.asarray(means, float))
    if along is not None and means.shape[1] > 1:
        means = _rotate(means, along)
    coef = np.asarray(wp, float) - math.exp(eps) * np.asarray(wq, float)
    k = means.shape[1]
    lo = means[:, 0].min() - _REACH * sigma
    hi = means[:, 0].max() + _REACH * sigma
    if k == 1:
        return float(_line_positive_part(coef[None, :], means[:, 0], sigma, lo, hi)[0])
    axes = []
    for j in range(1, k):
        a = means[:, j].min() - _REACH * sigma
        b = means[:, j].max() + _REACH * sigma
        n = int(math.ceil((b - a) / (_OUTER_STEP * sigma)))
        axes.append(np.linspace(a, b, n + 1))
    grids = np.meshgrid(*axes, indexing="ij")
    nodes = np.stack([g.ravel() for g in grids], axis=1)  # (R, k - 1)
    weight = np.ones(nodes.shape[0])
    for j, ax in enumerate(axes):
        h = ax[1] - ax[0]
        w1 = np.full(ax.size, h)
        w1[[0, -1]] = h / 2
        weight *= w1[np.searchsorted(ax, nodes[:, j])]
    total = 0.0
    for start in range(0, nodes.shape[0], 4000):
        y = nodes[start : start + 4000]
        other = np.prod(
            stats.norm.pdf((y[:, None, :] - means[None, :, 1:]) / sigma) / sigma, axis=2
        )
        vals = _line_positive_part(coef[None, :] * other, means[:, 0], sigma, lo, hi)
        total += float(np.sum(weight[start : start + 4000] * vals))
    return total


def both_directions(means, wp, wq, eps, sigma, along=None):
    return {
        "remove": hockey(means, wp, wq, eps, sigma, along),
        "add": hockey(means, wq, wp, eps, sigma, along),
    }


# --------------------------------------------------------------------------
# the pairs
# --------------------------------------------------------------------------


def label_pair(p, q, mu, g):
    """Label-level pair (W with the record, O without) for sum mu and gradient g."""
    mu, g = np.asarray(mu, float), np.asarray(g, float)
    means = np.stack([np.zeros_like(mu), mu, mu + g])
    return means, [1 - p, p * (1 - q), p * q], [1 - p, p, 0.0]


def aligned_1d(p, q, i):
    return label_pair(p, q, [float(i)], [1.0])


def anti_aligned_1d(p, q, i):
    return label_pair(p, q, [float(i)], [-1.0])


def mechanism(p, q, companions, target):
    """The whole round, label hidden: every subset S of companions."""
    companions = np.asarray(companions, float)
    target = np.asarray(target, float)
    d = companions.shape[0]
    means, wp, wq = [np.zeros_like(target)], [1 - p], [1 - p]
    for bits in itertools.product((0, 1), repeat=d):
        s = sum(bits)
        w = q**s * (1 - q) ** (d - s)
        g_s = np.asarray(bits, float) @ companions
        means += [g_s, g_s + target]
        wp += [p * w * (1 - q), p * w * q]
        wq += [p * w, 0.0]
    return np.array(means), np.array(wp), np.array(wq)


def _unit(deg, k=2):
    v = np.zeros(k)
    v[0], v[1] = math.cos(math.radians(deg)), math.sin(math.radians(deg))
    return v


# (p, q, sigma): the add-direction counterexample to the aligned-only pair,
# two small-sigma points where both directions matter, and a moderate one.
POINTS = [
    (0.0019160, 0.019035, 1.15465),
    (0.3, 0.3, 1.0),
    (0.1, 0.5, 0.8),
    (0.5, 0.5, 1.5),
]
EPSILONS = (0.0, 0.005, 0.1, 0.5, 1.5)

# Tolerance of a configuration against the worst case it must not exceed:
# the quadrature's accuracy (1e-9 relative where the value is large; about
# 1e-16 absolute from the CDF sums where it is tiny), with margin.
RTOL, ATOL = 1e-7, 1e-15


# --------------------------------------------------------------------------
# 0. the quadrature itself
# --------------------------------------------------------------------------


def test_quadrature_matches_closed_form_gaussian():
    # N(v, I) against N(0, I) in 2-D and 3-D: D_{e^eps} is the closed form
    # Phi(-eps/|v| + |v|/2) - e^eps Phi(-eps/|v| - |v|/2) (Balle & Wang 2018,
    # Theorem 8), whatever the direction of v. Tolerance 1e-9 relative.
    for k, v in ((2, [0.6, 0.8]), (3, [0.3, -0.4, 1.2])):
        v = np.asarray(v)
        mu = float(np.linalg.norm(v))
        for eps in (0.0, 0.3, 1.0):
            exact = special.ndtr(-eps / mu + mu / 2) - math.exp(eps) * special.ndtr(
                -eps / mu - mu / 2
            )
            got = hockey(np.stack([np.zeros(k), v]), [0, 1], [1, 0], eps, 1.0)
            assert got == pytest.approx(exact, rel=1e-9), (k, eps)


def test_quadrature_converges():
    # Halving the trapezoid spacing moves a 2-D mixture value by < 1e-9 rel.
    global _OUTER_STEP
    means, wp, wq = mechanism(0.3, 0.3, [_unit(100), 0.7 * _unit(230)], _unit(0))
    base = hockey(means, wq, wp, 0.1, 1.0)
    saved = _OUTER_STEP
    try:
        _OUTER_STEP = saved / 2
        fine = hockey(means, wq, wp, 0.1, 1.0)
    finally:
        _OUTER_STEP = saved
    assert base == pytest.approx(fine, rel=1e-9)


# --------------------------------------------------------------------------
# 1. per label: aligned is the worst remove, anti-aligned the worst add
# --------------------------------------------------------------------------


def _label_configurations(i, rng, k):
    """(mu, g') with ||mu|| <= i, ||g'|| <= 1: structured and random, in R^k."""
    out = []
    for deg in (0, 45, 90, 135, 180):
        for rho in (0.0, 0.5 * i, float(i)):
            for nu in (0.4, 1.0):
                out.append((rho * _unit(deg, k), nu * _unit(0, k)))
    for _ in range(6):
        mu = rng.standard_normal(k)
        g = rng.standard_normal(k)
        out.append((mu * rng.uniform(0, i) / np.linalg.norm(mu), g / np.linalg.norm(g)))
    return out


# default run under 4 minutes: two cases here, the rest under slow (.ci/run)
_SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "p,q,sigma,i",
    [
        (*POINTS[0], 3),
        (*POINTS[1], 1),
        pytest.param(*POINTS[1], 3, marks=_SLOW),
        pytest.param(*POINTS[2], 1, marks=_SLOW),
        pytest.param(*POINTS[2], 3, marks=_SLOW),
        pytest.param(*POINTS[3], 2, marks=_SLOW),
    ],
)
def test_label_worst_cases_2d(p, q, sigma, i):
    # Every planar configuration of label i is at most the aligned pair's
    # remove value and the anti-aligned pair's add value, at every eps tried;
    # the aligned and anti-aligned configurations (placed off the axes, so the
    # 2-D quadrature is exercised) attain them.
    rng = np.random.default_rng(1000 * i + int(100 * p))
    for eps in EPSILONS:
        rem = hockey(*aligned_1d(p, q, i), eps, sigma)
        means, wp, wq = anti_aligned_1d(p, q, i)
        add = hockey(means, wq, wp, eps, sigma)
        for mu, g in _label_configurations(i, rng, 2):
            got = both_directions(*label_pair(p, q, mu, g), eps, sigma, along=g)
            assert got["remove"] <= rem * (1 + RTOL) + ATOL, (eps, mu, g)
            assert got["add"] <= add * (1 + RTOL) + ATOL, (eps, mu, g)
        turn = _unit(37)
        # the exact axis stays the first one here, so the 2-D rule is exercised
        attained_rem = hockey(*label_pair(p, q, i * turn, turn), eps, sigma)
        means, wp, wq = label_pair(p, q, i * turn, -turn)
        attained_add = hockey(means, wq, wp, eps, sigma)
        assert attained_rem == pytest.approx(rem, rel=RTOL, abs=ATOL)
        assert attained_add == pytest.approx(add, rel=RTOL, abs=ATOL)


@pytest.mark.slow  # 3-D quadrature; .ci/run runs it (-m slow)
@pytest.mark.parametrize("p,q,sigma", POINTS[1:3])
def test_label_worst_cases_3d(p, q, sigma):
    rng = np.random.default_rng(7)
    i = 2
    for eps in (0.0, 0.1, 1.0):
        rem = hockey(*aligned_1d(p, q, i), eps, sigma)
        means, wp, wq = anti_aligned_1d(p, q, i)
        add = hockey(means, wq, wp, eps, sigma)
        for mu, g in _label_configurations(i, rng, 3)[-8:]:
            got = both_directions(*label_pair(p, q, mu, g), eps, sigma, along=g)
            assert got["remove"] <= rem * (1 + RTOL) + ATOL
            assert got["add"] <= add * (1 + RTOL) + ATOL


# --------------------------------------------------------------------------
# 2. the whole mechanism against dpfl's "sound" round delta
# --------------------------------------------------------------------------


def _sound(p, q, d, sigma, eps, direction):
    return rp.round_delta(
        eps,
        participation_probability=p,
        record_probability=q,
        records_per_client=d,
        noise_multiplier=sigma,
        analysis="sound",
        direction=direction,
    )


@pytest.mark.parametrize("p,q,sigma", POINTS)
@pytest.mark.parametrize("d", [0, 2, 5])
def test_sound_is_the_label_mixture_of_aligned_and_anti_aligned(p, q, sigma, d):
    # dpfl's per-round curve, each direction, equals sum_i Binom(i; d, q) times
    # the aligned (remove) / anti-aligned (add) pair's value computed here in
    # 1-D: the two pairs attain the worst case (1e-9 relative).
    w = stats.binom.pmf(np.arange(d + 1), d, q)
    for eps in EPSILONS:
        rem = math.fsum(
            w[i] * hockey(*aligned_1d(p, q, i), eps, sigma) for i in range(d + 1)
        )
        add = 0.0
        for i in range(d + 1):
            means, wp, wq = anti_aligned_1d(p, q, i)
            add += w[i] * hockey(means, wq, wp, eps, sigma)
        assert _sound(p, q, d, sigma, eps, "remove") == pytest.approx(
            rem, rel=1e-9, abs=ATOL
        )
        assert _sound(p, q, d, sigma, eps, "add") == pytest.approx(
            add, rel=1e-9, abs=ATOL
        )


def _mechanism_configurations(d, k, rng):
    """Companions (d of them) and a target in R^k, named."""
    e = [_unit(0, k), _unit(90, k)] + ([np.eye(3)[2]] if k == 3 else [])
    out = {
        "aligned": ([e[0]] * d, e[0]),
        "anti-aligned": ([-e[0]] * d, e[0]),
        "orthogonal": ([e[1]] * d, e[0]),
        "zero": ([0 * e[0]] * d, e[0]),
        "spread": ([_unit(360 * j / d + 40, k) for j in range(d)], e[0]),
        "mixed": ([e[0] if j % 2 else -e[1] for j in range(d)], 0.6 * e[0]),
    }
    if k == 3:
        tet = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]])
        tet = tet / math.sqrt(3)
        out["tetrahedral"] = (list(tet[1 : d + 1]), tet[0])
    for r in range(3):
        comp = rng.standard_normal((d, k))
        comp *= rng.uniform(0, 1, (d, 1)) / np.linalg.norm(comp, axis=1, keepdims=True)
        t = rng.standard_normal(k)
        out[f"random-{r}"] = (list(comp), t * rng.uniform(0.3, 1) / np.linalg.norm(t))
    return out


@pytest.mark.parametrize(
    "p,q,sigma,d",
    [
        (*POINTS[1], 2),
        pytest.param(*POINTS[1], 3, marks=_SLOW),
        pytest.param(*POINTS[2], 3, marks=_SLOW),
        pytest.param(*POINTS[3], 2, marks=_SLOW),
    ],
)
def test_mechanism_never_exceeds_sound_2d(p, q, sigma, d):
    rng = np.random.default_rng(d)
    configs = _mechanism_configurations(d, 2, rng)
    for eps in (0.0, 0.1, 1.0):
        sound = {s: _sound(p, q, d, sigma, eps, s) for s in ("remove", "add")}
        for name, (comp, target) in configs.items():
            got = both_directions(
                *mechanism(p, q, comp, target), eps, sigma, along=target
            )
            for s in ("remove", "add"):
                assert got[s] <= sound[s] * (1 + RTOL) + ATOL, (name, eps, s)


@pytest.mark.slow  # 3-D quadrature; .ci/run runs it (-m slow)
@pytest.mark.parametrize("p,q,sigma", POINTS[1:3])
def test_mechanism_never_exceeds_sound_3d(p, q, sigma):
    d = 3
    rng = np.random.default_rng(11)
    configs = _mechanism_configurations(d, 3, rng)
    for eps in (0.0, 0.5):
        sound = {s: _sound(p, q, d, sigma, eps, s) for s in ("remove", "add")}
        for name, (comp, target) in configs.items():
            got = both_directions(
                *mechanism(p, q, comp, target), eps, sigma, along=target
            )
            for s in ("remove", "add"):
                assert got[s] <= sound[s] * (1 + RTOL) + ATOL, (name, eps, s)
