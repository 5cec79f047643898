"""Random participation: fixed gradient configurations against dpfl's analyses.

Everything dpfl is compared with here is computed independently of dpfl: the
output distributions of one round for a FIXED configuration of gradients
(companions ``g_1..g_d``, target ``x'``) are Gaussian mixtures in R^k,

    P = (1-p) N(0) + p sum_S q^|S| (1-q)^(d-|S|) [(1-q) N(g_S) + q N(g_S + x')]
    Q = (1-p) N(0) + p sum_S q^|S| (1-q)^(d-|S|) N(g_S)

(covariance sigma^2 I, ``g_S`` the sum over the sampled companions S), and
their privacy-loss distributions (PLDs) are built by quadrature on a grid of
cells in the span of the vectors (k = 1, 2 or 3), then composed over T rounds
with dp_accounting. Each configuration gets a two-sided bracket:

* lower: the pair of cell masses (exact, from normal CDFs) is a
  post-processing of (P, Q), so its PLD, with losses rounded DOWN and the
  mass outside the grid dropped, gives an epsilon <= the configuration's;
* upper: every cell gets its exact mass under the upper distribution and a
  loss bound valid on the whole cell, ``l(c) + sum_j |d_j l(c)| h_j / 2 +
  H |h/2|^2 / 2`` (``grad l = (mean_P(z) - mean_Q(z)) / sigma^2`` with
  posterior means of the components, ``||hess l|| <= H = D^2 / (4 sigma^4)``,
  D the diameter of the set of means), rounded UP; the mass outside the grid
  goes to the infinity mass. Its epsilon is >= the configuration's.

Random participation, record-level add/remove of one record x' of one client
(Hasircioglu & Gunduz, arXiv 2205.01556).
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as dpl
from scipy import integrate, optimize, special, stats

from dpfl.accounting import participation as rp

# --------------------------------------------------------------------------
# independent PLD of a fixed configuration
# --------------------------------------------------------------------------

WIDTH = 7.0  # the grid reaches WIDTH sigma beyond the means on every axis
LOSS_STEP = 1e-4  # privacy-loss discretisation (composed shift <= T * step)


def _basis_coordinates(companions, target):
    """Coordinates of target and companions in an orthonormal basis of their span.

    The target comes first (Gram-Schmidt), so it is ``|x'| e_0``; only the
    span matters (the noise is isotropic), so k is as small as possible.
    """
    vectors = [np.asarray(target, float)] + [np.asarray(g, float) for g in companions]
    basis = []
    for v in vectors:
        r = v - sum((v @ b) * b for b in basis)
        if np.linalg.norm(r) > 1e-9:
            basis.append(r / np.linalg.norm(r))
    b = np.array(basis)
    return b @ vectors[0], np.array([b @ g for g in vectors[1:]]).reshape(-1, len(b))


def _mixtures(p, q, companions, target):
    """Component means and weights of P (with x') and Q (without), merged."""
    t, g = _basis_coordinates(companions, target)
    d = g.shape[0]
    comps: dict[tuple, list[float]] = {}

    def add(mean, wp, wq):
        key = tuple(np.round(mean, 12) + 0.0)
        acc = comps.setdefault(key, [0.0, 0.0])
        acc[0] += wp
        acc[1] += wq

    add(np.zeros_like(t), 1 - p, 1 - p)
    for bits in itertools.product((0, 1), repeat=d):
        s = sum(bits)
        w = q**s * (1 - q) ** (d - s)
        g_s = np.asarray(bits, float) @ g if d else np.zeros_like(t)
        add(g_s, p * w * (1 - q), p * w)
        add(g_s + t, p * w * q, 0.0)
    means = np.array(list(comps))
    wp = np.array([v[0] for v in comps.values()])
    wq = np.array([v[1] for v in comps.values()])
    return means, wp, wq


def _interval_mass(lo, hi):
    """Standard normal mass of [lo, hi], accurate in both tails."""
    return np.where(
        hi <= 0,
        special.ndtr(hi) - special.ndtr(lo),
        special.ndtr(-lo) - special.ndtr(-hi),
    )


def _contract(w, facs):
    """``sum_c w_c prod_j facs[j][c, i_j]`` as an array over (i_0, ..., i_{k-1})."""
    if len(facs) == 1:
        return w @ facs[0]
    out = w[:, None] * facs[0]
    for f in facs[1:-1]:
        out = out[..., None] * f.reshape((f.shape[0],) + (1,) * (out.ndim - 1) + (-1,))
    return np.tensordot(out, facs[-1], axes=([0], [0]))


class _Histogram:
    """Accumulates mass on integer loss indices (one privacy-loss pmf)."""

    def __init__(self):
        self.parts = []

    def add(self, idx, weights):
        idx = idx.ravel()
        lo = int(idx.min())
        self.parts.append((lo, np.bincount(idx - lo, weights=weights.ravel())))

    def pmf(self):
        lo = min(p[0] for p in self.parts)
        hi = max(p[0] + p[1].size for p in self.parts)
        acc = np.zeros(hi - lo)
        for start, counts in self.parts:
            acc[start - lo : start - lo + counts.size] += counts
        nz = np.nonzero(acc)[0]
        return {int(i + lo): float(acc[i]) for i in nz}


def _bracket(means, wp, wq, sigma, cells, *, rounds, delta, slab_cells=4e6):
    """Composed epsilon brackets ``{(bound, direction): eps}`` of one pair.

    ``cells[j]`` is the cell width on axis j; bound is "lower" or "upper",
    direction "remove" (PLD of (P, Q)) or "add" (PLD of (Q, P)).
    """
    k = means.shape[1]
    h = np.asarray(cells, float)
    diam = max(np.linalg.norm(a - b) for a in means for b in means)
    hess = diam**2 / (4 * sigma**4)
    curvature = 0.5 * hess * float(np.sum((h / 2) ** 2))
    edges = []
    for j in range(k):
        lo = means[:, j].min() - WIDTH * sigma
        n = math.ceil((means[:, j].max() + WIDTH * sigma - lo) / h[j])
        edges.append(lo + h[j] * np.arange(n + 1))
    mid = [0.5 * (e[1:] + e[:-1]) for e in edges]
    # per-axis factors, shape (components, cells on the axis); the densities
    # are unnormalised (the constant cancels in every ratio used)
    dens = [
        np.exp(-0.5 * ((c[None, :] - means[:, [j]]) / sigma) ** 2)
        for j, c in enumerate(mid)
    ]
    mass = [
        _interval_mass(
            (e[None, :-1] - means[:, [j]]) / sigma,
            (e[None, 1:] - means[:, [j]]) / sigma,
        )
        for j, e in enumerate(edges)
    ]
    inside = np.prod([m.sum(axis=1) for m in mass], axis=0)  # per component
    out_p, out_q = float(wp @ (1 - inside)), float(wq @ (1 - inside))
    hist = {
        key: _Histogram()
        for key in itertools.product(("lower", "upper"), ("remove", "add"))
    }
    per_slab = max(1, int(slab_cells // max(1, np.prod([m.size for m in mid[1:]]))))
    for start in range(0, mid[0].size, per_slab):
        sl = slice(start, start + per_slab)
        dn = [dens[0][:, sl]] + dens[1:]
        ms = [mass[0][:, sl]] + mass[1:]
        da, db = _contract(wp, dn), _contract(wq, dn)
        loss = np.log(da) - np.log(db)  # loss at the cell centre
        slack = np.full(loss.shape, curvature)
        for j in range(k):
            grad = (
                _contract(wp * means[:, j], dn) / da
                - _contract(wq * means[:, j], dn) / db
            )
            slack += np.abs(grad) * (h[j] / (2 * sigma**2))
        ma, mb = _contract(wp, ms), _contract(wq, ms)
        ok = (ma > 0) & (mb > 0)
        cell_loss = np.log(np.where(ok, ma, 1.0)) - np.log(np.where(ok, mb, 1.0))
        hist["upper", "remove"].add(
            np.ceil((loss + slack) / LOSS_STEP).astype(np.int64), ma
        )
        hist["upper", "add"].add(
            np.ceil((slack - loss) / LOSS_STEP).astype(np.int64), mb
        )
        hist["lower", "remove"].add(
            np.floor(cell_loss / LOSS_STEP).astype(np.int64), ma * ok
        )
        hist["lower", "add"].add(
            np.floor(-cell_loss / LOSS_STEP).astype(np.int64), mb * ok
        )
    result = {}
    for (bound, direction), hg in hist.items():
        infinity = (
            0.0 if bound == "lower" else (out_p if direction == "remove" else out_q)
        )
        pld = dpl.PrivacyLossDistribution.create_from_rounded_probability(
            hg.pmf(), infinity, LOSS_STEP, pessimistic_estimate=bound == "upper"
        )
        result[bound, direction] = pld.self_compose(rounds).get_epsilon_for_delta(delta)
    return result


# --------------------------------------------------------------------------
# the scenario and its configurations
# --------------------------------------------------------------------------

P, Q_REC, D, SIGMA, T, DELTA = 0.3, 0.5, 3, 1.5, 50, 1e-5
SCHEME = dict(
    participation_probability=P,
    record_probability=Q_REC,
    records_per_client=D,
    noise_multiplier=SIGMA,
)


def _unit(deg):
    return np.array([math.cos(math.radians(deg)), math.sin(math.radians(deg))])


_E = np.eye(3)
# name -> (companions g_1..g_d, target x'); all norms <= 1, d = D
CONFIGS = {
    "aligned": ([[1.0]] * D, [1.0]),
    "anti_aligned": ([[-1.0]] * D, [1.0]),
    "angle_60": ([_unit(60)] * D, _unit(0)),
    "angle_120": ([_unit(120)] * D, _unit(0)),
    "zero": ([[0.0]] * D, [1.0]),
    "mixed_3d": ([_E[0], _E[1], -_E[0]], np.ones(3) / math.sqrt(3)),
    "short_mixed_2d": ([0.5 * _unit(90), 0.5 * _unit(180), 0.3 * _unit(-45)], _unit(0)),
    "short_anti_aligned": ([[-0.5]] * D, [1.0]),
}
# cell widths: fine along the target (axis 0), coarser across it
CELLS = {1: (0.002,), 2: (0.005, 0.03), 3: (0.04, 0.1, 0.1)}


@functools.cache
def config_bracket(name):
    companions, target = CONFIGS[name]
    means, wp, wq = _mixtures(P, Q_REC, companions, target)
    return _bracket(means, wp, wq, SIGMA, CELLS[means.shape[1]], rounds=T, delta=DELTA)


@functools.cache
def dpfl_epsilon(analysis):
    return rp.epsilon(DELTA, rounds=T, analysis=analysis, **SCHEME).upper


# --------------------------------------------------------------------------
# 1. the counterexample to the per-label alignment lemma (add direction)
# --------------------------------------------------------------------------


def _hockey_1d(means, wa, wb, eps, sigma):
    """``D_{e^eps}(A || B)`` of two 1-D Gaussian mixtures, two ways.

    The roots of ``a - e^eps b`` (at most two for three equal-variance
    components: Descartes' rule of signs for exponential sums) are bracketed
    on a grid of step sigma/2000 and polished with brentq; the positive part
    is integrated (i) exactly, with normal CDFs between consecutive roots, and
    (ii) with scipy quad on each interval between roots. Returns both.
    """
    means = np.asarray(means, float)
    coef = np.asarray(wa, float) - math.exp(eps) * np.asarray(wb, float)

    def f(z):
        return stats.norm.pdf(np.asarray(z, float)[..., None], means, sigma) @ coef

    lo, hi = means.min() - 14 * sigma, means.max() + 14 * sigma
    z = np.arange(lo, hi, sigma / 2000)
    fz = f(z)
    roots = [
        optimize.brentq(f, z[i], z[i + 1], xtol=1e-15, rtol=1e-15)
        for i in np.nonzero(np.sign(fz[:-1]) != np.sign(fz[1:]))[0]
    ]
    cuts = [-np.inf, *roots, np.inf]
    exact, quad = [], []
    for a, b in zip(cuts[:-1], cuts[1:]):
        centre = (max(a, lo) + min(b, hi)) / 2
        if f(centre) <= 0:
            continue
        cdf = stats.norm.cdf(b, means, sigma) - stats.norm.cdf(a, means, sigma)
        exact.append(float(cdf @ coef))
        quad.append(
            integrate.quad(
                f, max(a, lo), min(b, hi), epsabs=1e-18, epsrel=1e-12, limit=500
            )[0]
        )
    return math.fsum(exact), math.fsum(quad)


def _label_pair(p, q, i, back):
    """The label-i pair: P_i (with x') and Q_i (without), 1-D means in units of C.

    Aligned: x' continues the companions' sum i (means 0, i, i+1);
    "pointing back": x' = -C (means 0, i, i-1).
    """
    means = [0.0, float(i), float(i - 1 if back else i + 1)]
    return means, [1 - p, p * (1 - q), p * q], [1 - p, p, 0.0]


def test_counterexample_point_1_add_direction():
    # Checks: p=0.0019160, q=0.019035, sigma=1.15465, label 5, eps=0.005;
    # D(Q||P) is 6.42e-6 with x' pointing back (means 0,5,4) against 1.49e-6
    # aligned (0,5,6), i.e. the lemma fails in the add direction; the aligned
    # remove direction D(P||Q) (9.49e-6) is still above it for this label.
    # Independent: 1-D root finding + exact CDF integration, cross-checked by
    # scipy quad to 1e-9 relative. Tolerance: 2% relative on the stated figures
    # (given to 3 digits).
    p, q, sigma, i, eps = 0.0019160, 0.019035, 1.15465, 5, 0.005
    mb, pb, qb = _label_pair(p, q, i, back=True)
    ma, pa, qa = _label_pair(p, q, i, back=False)
    back, back_quad = _hockey_1d(mb, qb, pb, eps, sigma)
    aligned, aligned_quad = _hockey_1d(ma, qa, pa, eps, sigma)
    remove, _ = _hockey_1d(ma, pa, qa, eps, sigma)
    assert back_quad == pytest.approx(back, rel=1e-9)
    assert aligned_quad == pytest.approx(aligned, rel=1e-9)
    assert back == pytest.approx(6.42e-6, rel=0.02)
    assert aligned == pytest.approx(1.49e-6, rel=0.02)
    assert remove == pytest.approx(9.49e-6, rel=0.02)
    assert aligned < back < remove


def test_counterexample_point_2_add_direction():
    # Checks: p=0.0030145, q=0.14795, sigma=0.41306, label 2. The issue gives
    # no eps; the stated excess ~3.7e-5 is the MAXIMUM over eps of
    # D(Q||P_back) - D(Q||P_aligned), reached near eps ~= 0.055 (3.675e-5).
    # At that eps the aligned remove direction (3.28e-4) still dominates.
    # Independent: as in point 1, maximised with a bounded scalar search over
    # eps in [0, 0.2]. Tolerance: 2% relative on 3.7e-5; eps* within 0.01.
    p, q, sigma, i = 0.0030145, 0.14795, 0.41306, 2
    mb, pb, qb = _label_pair(p, q, i, back=True)
    ma, pa, qa = _label_pair(p, q, i, back=False)

    def excess(eps):
        return (
            _hockey_1d(mb, qb, pb, eps, sigma)[0]
            - _hockey_1d(ma, qa, pa, eps, sigma)[0]
        )

    res = optimize.minimize_scalar(
        lambda e: -excess(e),
        bounds=(0.0, 0.2),
        method="bounded",
        options={"xatol": 1e-4},
    )
    eps_star, best = float(res.x), -float(res.fun)
    assert best == pytest.approx(3.7e-5, rel=0.02)
    assert eps_star == pytest.approx(0.055, abs=0.01)
    assert (
        _hockey_1d(ma, pa, qa, eps_star, sigma)[0]
        > _hockey_1d(mb, qb, pb, eps_star, sigma)[0]
    )


# --------------------------------------------------------------------------
# 2. sanity: the grid PLD against dp_accounting's subsampled Gaussian
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "target,cells,tol",
    [
        (np.array([[1.0]]), CELLS[1], 0.005),
        (_unit(30)[None, :], CELLS[2], 0.02),
        pytest.param(
            np.array([[0.8, 0.36, 0.48]]), CELLS[3], 0.08, marks=pytest.mark.slow
        ),
    ],
    ids=["1d", "2d-rotated", "3d-rotated"],
)
def test_grid_pld_matches_subsampled_gaussian(target, cells, tol):
    # Checks: with zero companion gradients P, Q are the rate-pq Poisson-
    # subsampled Gaussian pair, whatever the direction of x' (here deliberately
    # NOT along a grid axis in 2-D and 3-D, the worst case for the grid), so
    # the grid bracket of section 0 must contain dp_accounting's value
    # (from_gaussian_mechanism, sampling_prob=pq, step 1e-4, pessimistic and
    # optimistic) per direction, after T rounds. Tolerance: the bracket is
    # rigorous, so containment is asserted up to 1e-3 (dp_accounting's own
    # discretisation); its width must be below tol (0.5% in 1-D, 2% in 2-D,
    # 8% in 3-D, where the cells across x' are coarse; the lower end stays
    # within 0.1% there, the upper end carries the first-order cell slack).
    rate = P * Q_REC
    k = target.shape[1]
    means = np.vstack([np.zeros((1, k)), target])
    got = _bracket(
        means,
        np.array([1 - rate, rate]),
        np.array([1.0, 0.0]),
        SIGMA,
        cells,
        rounds=T,
        delta=DELTA,
    )
    ref = {}
    for bound, pess in (("upper", True), ("lower", False)):
        pld = dpl.from_gaussian_mechanism(
            SIGMA,
            sampling_prob=rate,
            value_discretization_interval=1e-4,
            pessimistic_estimate=pess,
            use_connect_dots=pess,
        ).self_compose(T)
        # pylint: disable=protected-access
        ref[bound, "remove"] = pld._pmf_remove.get_epsilon_for_delta(DELTA)
        ref[bound, "add"] = pld._pmf_add.get_epsilon_for_delta(DELTA)
    for direction in ("remove", "add"):
        lo, hi = got["lower", direction], got["upper", direction]
        assert lo <= ref["upper", direction] * (1 + 1e-3)
        assert hi >= ref["lower", direction] * (1 - 1e-3)
        assert hi - lo <= tol * ref["upper", direction]


# --------------------------------------------------------------------------
# 3. every fixed configuration is below wcs (proven without any lemma)
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.slow) if n in ("aligned", "mixed_3d") else n
        for n in CONFIGS
    ],
)
def test_configuration_below_wcs(name):
    # Checks: the configuration's own T-round epsilon (the upper end of the
    # independent grid bracket, max over add/remove) is <= dpfl's
    # epsilon(analysis="wcs").upper; wcs relaxes every configuration (the
    # adversary is given the participation bit and the companions' sum).
    # Tolerance: 1% slack (the bracket is itself rigorous; the slack only
    # covers dp_accounting's floating point / tail truncation).
    got = config_bracket(name)
    upper = max(got["upper", "remove"], got["upper", "add"])
    lower = max(got["lower", "remove"], got["lower", "add"])
    wcs = dpfl_epsilon("wcs")
    sound = dpfl_epsilon("sound")
    print(
        f"{name}: config eps in [{lower:.4f}, {upper:.4f}] "
        f"(remove [{got['lower', 'remove']:.4f}, {got['upper', 'remove']:.4f}], "
        f"add [{got['lower', 'add']:.4f}, {got['upper', 'add']:.4f}]); "
        f"wcs {wcs:.4f}, sound {sound:.4f}"
    )
    assert lower <= upper
    assert upper <= wcs * 1.01


@pytest.mark.parametrize("name", list(CONFIGS))
def test_configuration_below_sound_overall(name):
    # Checks: the configuration's T-round epsilon, max over directions, is <=
    # dpfl's epsilon(analysis="sound").upper (the two-sided conditional pair,
    # the default); section 4 checks each direction on its own. Independent:
    # grid bracket (upper end). Tolerance: none beyond the rigorous upper end.
    got = config_bracket(name)
    upper = max(got["upper", "remove"], got["upper", "add"])
    assert upper <= dpfl_epsilon("sound")


@pytest.mark.parametrize(
    "name,analysis", [("aligned", "paper"), ("zero", "cs")], ids=["aligned", "zero"]
)
def test_configuration_equals_closed_pair(name, analysis):
    # Checks: the aligned configuration IS the collinear pair of Theorem 4.1
    # (dpfl "paper" composes exactly that pair) and zero companions ARE the
    # rate-pq subsampled Gaussian (dpfl "cs"), so the independent grid bracket
    # and dpfl's bracket must overlap. Tolerance: 0.2% relative.
    got = config_bracket(name)
    lower = max(got["lower", "remove"], got["lower", "add"])
    upper = max(got["upper", "remove"], got["upper", "add"])
    ref = rp.epsilon(DELTA, rounds=T, analysis=analysis, **SCHEME)
    assert lower <= ref.upper * 1.002
    assert upper >= ref.lower * 0.998


# --------------------------------------------------------------------------
# 4. the two-sided conditional pair ("sound") dominates each direction
# --------------------------------------------------------------------------


@functools.cache
def _sound_direction_upper():
    pld = rp.participation_pld(
        analysis="sound", value_discretization=1e-4, pessimistic=True, **SCHEME
    ).self_compose(T)
    # pylint: disable=protected-access
    return {
        "remove": pld._pmf_remove.get_epsilon_for_delta(DELTA),
        "add": pld._pmf_add.get_epsilon_for_delta(DELTA),
    }


@pytest.mark.parametrize(
    "name", ["anti_aligned", "angle_120", "angle_60", "short_anti_aligned"]
)
def test_sound_dominates_each_direction(name):
    # The aligned-only conditional pair was exceeded in the add direction by
    # these configurations (composed add epsilon 2.98 against its 2.578 at
    # p=0.3, q=0.5, d=3, sigma=1.5, T=50, delta=1e-5). The two-sided pair
    # takes the anti-aligned companions as the add direction's worst case, and
    # dominates every configuration in EACH direction separately, which is
    # what composing the directions separately needs. Independent: the upper
    # end of the grid bracket of each configuration (rigorous). Tolerance:
    # 1e-3 relative (dp_accounting's own floating point and tail truncation).
    got = config_bracket(name)
    sound = _sound_direction_upper()
    for direction in ("remove", "add"):
        assert got["upper", direction] <= sound[direction] * (1 + 1e-3), direction
