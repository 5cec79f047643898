"""Monte-Carlo audits of schemes in which the clients add the noise.

When every participant adds its own Gaussian noise, the noise level of what is
released (in high dimension its squared norm is almost deterministic) tells an
observer how many clients took part, and with 1/p scaling which ones. An
analysis that lets the adversary not see who took part can then be wrong.

Each test simulates the released statistic exactly with scalars: for
independent z_k ~ N(0, I_d), ``||sum_k a_k z_k||^2 = (sum_k a_k^2) chi^2_d``, and
the projection on a fixed unit vector e and the squared norm of the other
d - 1 coordinates are independent (N(0, sum a_k^2) and
``(sum a_k^2) chi^2_{d-1}``). The helper :mod:`mc_audit` turns samples of
statistics in two neighbouring worlds into a lower bound on delta(epsilon)
with stated confidence (exact Clopper-Pearson, threshold chosen on one half
of the samples, evaluated on the other, Bonferroni over the two worlds).

Every bound below is at confidence ``CONFIDENCE = 0.999``: an assertion
``lower bound <= true delta`` fails with probability at most 1e-3 (its
false-alarm probability) and an assertion ``lower bound > priced delta``
refutes the pricing at confidence 0.999. All generators are seeded, so the
numbers are reproducible.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld
from scipy import integrate, stats

from mc_audit import clopper_pearson, delta_lower_bound, gaussian_delta

CONFIDENCE = 0.999
DIM = 10_000  # model dimension d


@functools.cache
def _subsampled_gaussian_pld(noise: float, rate: float):
    return pld.from_gaussian_mechanism(
        noise,
        sampling_prob=rate,
        value_discretization_interval=1e-4,
        use_connect_dots=True,
    )


def _subsampled_gaussian_delta(noise: float, rate: float, eps: float) -> float:
    """dp_accounting: Poisson(rate)-subsampled Gaussian, add/remove, both ways."""
    return float(_subsampled_gaussian_pld(noise, rate).get_delta_for_epsilon(eps))


# ---------------------------------------------------------------------------
# A. the Monte-Carlo machinery on mechanisms of known delta
# ---------------------------------------------------------------------------


def test_clopper_pearson_bounds_are_exact():
    # Checks the CP bounds against their definition with scipy's binomial
    # tails: at the lower bound L, P(Bin(n, L) >= k) = alpha; at the upper
    # bound U, P(Bin(n, U) <= k) = alpha. Deterministic (no sampling).
    n, alpha = 1000, 0.01
    k = np.array([0, 1, 17, 500, 999, 1000])
    lo, up = clopper_pearson(k, n, alpha)
    assert lo[0] == 0.0 and up[-1] == 1.0
    for ki, li, ui in zip(k, lo, up):
        if ki > 0:
            assert stats.binom.sf(ki - 1, n, li) == pytest.approx(alpha, rel=1e-6)
        if ki < n:
            assert stats.binom.cdf(ki, n, ui) == pytest.approx(alpha, rel=1e-6)


def test_audit_direction_swap_is_symmetric():
    # "B||A" on (A, B) is "A||B" on (B, A): the same set (a threshold set on
    # the statistic or, mirrored, on its binned likelihood ratio) and the same
    # bound (deterministic given the samples; 20,000 samples per world).
    rng = np.random.default_rng(11)
    a = rng.standard_normal(20_000)
    b = rng.standard_normal(20_000) + 0.8
    r1 = delta_lower_bound(a, b, 0.5, direction="B||A")
    r2 = delta_lower_bound(b, a, 0.5, direction="A||B")
    assert r1.delta_lower == r2.delta_lower > 0
    assert r1.statistic == r2.statistic
    assert (r1.p_first, r1.p_second) == (r2.p_first, r2.p_second)
    both = delta_lower_bound(a, b, 0.5)
    assert both.direction in ("A||B", "B||A")


def test_audit_stays_below_gaussian_truth():
    # (i) Validity: N(0,1) vs N(mu,1), exact delta from the analytic Gaussian
    # formula Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu) (same both ways).
    # 200,000 samples per world per case, 16 cases, both directions allowed;
    # confidence 0.999 each, so with fresh seeds each assertion would fail
    # w.p. <= 1e-3 and the whole test w.p. <= 16e-3 (union bound).
    rng = np.random.default_rng(20240601)
    n = 200_000
    for mu in (0.5, 1.0, 2.0, 3.0):
        a = rng.standard_normal(n)
        b = rng.standard_normal(n) + mu
        for eps in (0.0, 0.5, 1.0, 3.0):
            truth = gaussian_delta(mu, eps)
            r = delta_lower_bound(a, b, eps, confidence=CONFIDENCE)
            assert 0.0 <= r.delta_lower <= truth, (mu, eps, r, truth)


def test_audit_false_alarm_rate_is_calibrated():
    # Validity of the stated confidence itself, by repetition: 400 independent
    # small audits (500 samples per world, confidence 0.8) of N(0,1) vs
    # N(1,1) at eps = 0.5. Each exceeds the truth w.p. <= 0.2, so the number
    # of exceedances is stochastically below Binomial(400, 0.2); the test
    # fails only if it exceeds that binomial's 1 - 1e-4 quantile (false-alarm
    # probability <= 1e-4). In practice CP is conservative and the count is
    # far lower (it is reported in the assertion message).
    rng = np.random.default_rng(7)
    truth = gaussian_delta(1.0, 0.5)
    reps, n, conf = 400, 500, 0.8
    exceed = 0
    for _ in range(reps):
        a = rng.standard_normal(n)
        b = rng.standard_normal(n) + 1.0
        r = delta_lower_bound(a, b, 0.5, confidence=conf, bins=20)
        exceed += r.delta_lower > truth
    limit = stats.binom.ppf(1 - 1e-4, reps, 1 - conf)
    assert exceed <= limit, (exceed, limit)


def test_audit_is_tight_on_gaussian():
    # (ii) Power: with 1,000,000 samples per world, at mu = 1, eps = 1
    # (truth 0.1269), the 0.999-confidence bound is within 20% of the truth
    # (obtained: about 0.12). Also <= truth (false alarm <= 1e-3).
    rng = np.random.default_rng(3)
    n = 1_000_000
    a = rng.standard_normal(n)
    b = rng.standard_normal(n) + 1.0
    truth = gaussian_delta(1.0, 1.0)
    r = delta_lower_bound(a, b, 1.0, confidence=CONFIDENCE)
    assert 0.8 * truth <= r.delta_lower <= truth, (r, truth)


# ---------------------------------------------------------------------------
# B.1/B.2 LOCKS (two-stage client sampling, client level)
# ---------------------------------------------------------------------------

Q1, M2, SIGMA_N, SIGMA_G, NU = 0.5, 2, 2.0, 2.0, 0.01


def _locks_round(
    rng: np.random.Generator, n: int, updates: list[float], population: int
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` LOCKS rounds; returns (projection of g_hat on e, ||g_hat||^2).

    Client k's clipped update is ``updates[k] * e`` (C = 1, |updates[k]| <= 1).
    Stage 1: each joins w.p. Q1 and releases max(NU, ||g_k|| + SIGMA_N xi_k);
    stage 2: p2_k = min(1, M2 n_k / sum_{S1} n_j); the estimator is
    g_hat = (1/population) sum_{S2} (g_k + SIGMA_G z_k) / (Q1 p2_k).
    """
    c = np.asarray(updates, dtype=float)
    k = c.size
    s1 = rng.random((n, k)) < Q1
    norms = np.maximum(NU, np.abs(c) + SIGMA_N * rng.standard_normal((n, k)))
    norms = np.where(s1, norms, 0.0)
    total = norms.sum(axis=1, keepdims=True)
    p2 = np.where(s1, np.minimum(1.0, M2 * norms / np.where(total > 0, total, 1)), 1)
    s2 = s1 & (rng.random((n, k)) < p2)
    w = np.where(s2, 1.0 / (population * Q1 * p2), 0.0)  # weight of g_tilde_k
    w2 = (w * w).sum(axis=1)
    proj = (w * c).sum(axis=1) + SIGMA_G * np.sqrt(w2) * rng.standard_normal(n)
    rest = SIGMA_G**2 * w2 * rng.chisquare(DIM - 1, n)
    return proj, proj * proj + rest


def test_locks_add_remove_attack_beats_old_pricing():
    # Checks: the OLD dpfl pricing of a LOCKS round (norm and update as ONE
    # Gaussian of noise multiplier (SIGMA_N^-2 + SIGMA_G^-2)^-1/2 = sqrt(2),
    # Poisson-subsampled at rate Q1, add/remove), computed independently with
    # dp_accounting, is below a Monte-Carlo lower bound of the real round's
    # delta: the observer sees only ||g_hat||^2. Worlds: A = target + one other
    # client, B = the other client only; every update is zero, d = 10,000.
    # The 1/K factor when the target is absent, two conventions:
    #   "fixed":    K = 2 in both worlds (the target's absence leaves the
    #               population size used by the server unchanged);
    #   "enrolled": K counts the enrolled clients (2 in A, 1 in B), so the
    #               scale of g_hat itself reveals the population size.
    # The attack wins under both; the size of the leak depends on it (about
    # 0.10 fixed, about 0.74 enrolled, at eps = 1 and 4).
    # 400,000 rounds per world; bound at confidence 0.999, so "bound > priced"
    # refutes the old pricing with error probability <= 1e-3 per assertion.
    noise = (SIGMA_N**-2 + SIGMA_G**-2) ** -0.5
    old = {eps: _subsampled_gaussian_delta(noise, Q1, eps) for eps in (1.0, 4.0)}
    assert old[1.0] == pytest.approx(0.0045, rel=0.01)
    assert old[4.0] == pytest.approx(8.8e-12, rel=0.01)
    n = 400_000
    for convention, k_a, k_b in (("fixed", 2, 2), ("enrolled", 2, 1)):
        rng = np.random.default_rng(101)
        _, norm_a = _locks_round(rng, n, [0.0, 0.0], k_a)
        _, norm_b = _locks_round(rng, n, [0.0], k_b)
        for eps in (1.0, 4.0):
            r = delta_lower_bound(norm_a, norm_b, eps, confidence=CONFIDENCE)
            assert r.delta_lower > old[eps], (convention, eps, r, old[eps])
            if convention == "fixed":
                # the reviewer's counterexample: delta >= 0.093 (eps 1),
                # >= 0.091 (eps 4) with 200,000 trials; here about 0.10
                assert r.delta_lower > 0.09, (eps, r)


def _two_stage_delta(q1: float, max_p2: float, sn: float, sg: float, eps: float):
    """Public-label mixture: q1 [(1 - p2) G_{1/sn} + p2 G_{sqrt(sn^-2 + sg^-2)}]."""
    mu_n = 1.0 / sn
    mu_c = math.sqrt(sn**-2 + sg**-2)
    return q1 * (
        (1 - max_p2) * gaussian_delta(mu_n, eps) + max_p2 * gaussian_delta(mu_c, eps)
    )


def test_locks_zero_out_below_new_pricing():
    # Checks: dpfl's NEW pricing of one LOCKS round under zero-out (the
    # target stays in the population; its clipped update is C e, norm C, in
    # world A and zero, norm 0, in world B; one other client with update 0 or
    # -C e; K = 2 in both worlds) is above a Monte-Carlo lower bound for the
    # observer of g_hat. Statistics: projection of g_hat on e, ||g_hat||^2,
    # and the projection divided by the noise scale estimated from the other
    # d - 1 coordinates (plus their binned likelihood ratios). The norm
    # release differs between the worlds too (||g|| = C vs 0) and moves p2.
    # Independent computation: the server-view public-label mixture
    # delta = Q1 [(1 - max_p2) delta_{1/SIGMA_N} + max_p2 delta_{mu_c}],
    # mu_c = sqrt(SIGMA_N^-2 + SIGMA_G^-2), max_p2 = 1, with the analytic
    # Gaussian delta; it must agree with dpfl's Accountant("server") to 1e-3.
    # 400,000 rounds per world; confidence 0.999: each "bound <= priced"
    # assertion is a false alarm w.p. <= 1e-3 if the pricing is right.
    from dpfl.accounting.accountant import Accountant
    from dpfl.accounting.events import Gaussian, TwoStage

    max_p2 = 1.0
    n = 400_000
    for other in (0.0, -1.0):
        rng = np.random.default_rng(202)
        proj_a, norm_a = _locks_round(rng, n, [1.0, other], 2)
        proj_b, norm_b = _locks_round(rng, n, [0.0, other], 2)
        # the simulator's estimator is unbiased: E[proj] = sum of updates / K
        for proj, total in ((proj_a, 1.0 + other), (proj_b, other)):
            se = proj.std() / math.sqrt(n)
            assert abs(proj.mean() - total / 2) < 5 * se

        def stats_of(proj: np.ndarray, norm: np.ndarray) -> np.ndarray:
            scale = np.sqrt(np.maximum(norm - proj * proj, 0.0) / (DIM - 1))
            t = np.where(scale > 0, proj / np.where(scale > 0, scale, 1.0), 0.0)
            return np.column_stack([proj, norm, t])

        xa, xb = stats_of(proj_a, norm_a), stats_of(proj_b, norm_b)
        for eps in (0.25, 0.5, 1.0):
            mine = _two_stage_delta(Q1, max_p2, SIGMA_N, SIGMA_G, eps)
            event = TwoStage(Q1, M2, max_p2, Gaussian(SIGMA_N), Gaussian(SIGMA_G))
            priced = Accountant("server").compose(event, count=1).delta(eps).upper
            assert priced == pytest.approx(mine, rel=1e-3), (eps, priced, mine)
            r = delta_lower_bound(xa, xb, eps, confidence=CONFIDENCE)
            assert r.delta_lower <= min(priced, mine), (other, eps, r, priced)


# ---------------------------------------------------------------------------
# B.3 MS-PAFL (record level, replace-one, visible check-in)
# ---------------------------------------------------------------------------


def _ms_pafl_round(
    rng: np.random.Generator,
    n: int,
    clients: int,
    sign: float,
    p: float,
    sigma: float,
) -> np.ndarray:
    """Observer statistics of ``n`` rounds: (projection, likelihood ratio).

    The target's clipped update is ``sign * C e`` (C = 1), the other clients'
    are 0. g_hat = (1/(K p)) sum_{checked in} (u_k + sigma z_k). The
    projection is y / (K p) with y = b_target sign + sigma sqrt(N) Z, N the
    number checked in; ||g_hat||^2 = proj^2 + sigma^2 N chi^2_{d-1} / (K p)^2
    reveals N. The second statistic is the exact log-likelihood ratio of the
    projection for +e against -e given the N read off ||g_hat||^2: given N = m,
    the target took part w.p. m / K.
    """
    b = rng.random((n, clients)) < p
    count = b.sum(axis=1)
    y = sign * b[:, 0] + sigma * np.sqrt(count) * rng.standard_normal(n)
    scale = 1.0 / (clients * p)
    proj = scale * y
    sq = proj * proj + scale**2 * sigma**2 * count * rng.chisquare(DIM - 1, n)
    # what the observer computes from (proj, ||g_hat||^2) alone
    m = np.rint(sq / (scale**2 * sigma**2 * DIM))
    yy = proj / scale
    sd = sigma * np.sqrt(np.maximum(m, 1.0))
    w = np.clip(m / clients, 1e-300, 1.0)
    rest = np.maximum(1.0 - w, 1e-300)
    log_plus = np.logaddexp(
        np.log(w) - 0.5 * ((yy - 1) / sd) ** 2, np.log(rest) - 0.5 * (yy / sd) ** 2
    )
    log_minus = np.logaddexp(
        np.log(w) - 0.5 * ((yy + 1) / sd) ** 2, np.log(rest) - 0.5 * (yy / sd) ** 2
    )
    llr = np.where(m > 0, log_plus - log_minus, 0.0)
    return np.column_stack([proj, llr])


def _ms_pafl_count_revealed_delta(clients: int, p: float, sigma: float, eps: float):
    """Exact delta of (y, N) for +e vs -e (numerical integration, both ways).

    The observer's view (proj, ||g_hat||^2) is a garbling of (y, N), so this
    bounds the observer's true delta from above (it is what the attack can
    at most reach).
    """
    y = np.linspace(-60.0, 60.0, 60_001)
    worst = 0.0
    for direction in (1.0, -1.0):
        total = 0.0
        for m in range(1, clients + 1):
            p_in = p * stats.binom.pmf(m - 1, clients - 1, p)
            p_out = (1 - p) * stats.binom.pmf(m, clients - 1, p)
            sd = sigma * math.sqrt(m)
            absent = p_out * stats.norm.pdf(y, 0.0, sd)
            f = p_in * stats.norm.pdf(y, direction, sd) + absent
            g = p_in * stats.norm.pdf(y, -direction, sd) + absent
            total += integrate.trapezoid(np.maximum(f - math.exp(eps) * g, 0.0), y)
        worst = max(worst, total)
    return worst


def test_ms_pafl_observer_below_sound_pricing():
    # Checks: for the observer of g_hat (not the server), with K = 1, 2, 3, 5
    # clients, p = 0.5, sigma = 2, replace-one of one record moving the
    # target's update from +C e to -C e (others 0), the Monte-Carlo lower bound
    # (statistics: projection on e and the likelihood ratio given the count
    # read off ||g_hat||^2) is below
    #   (a) dpfl's sound pricing p * delta_{mu = 2/sigma}(eps) (server view:
    #       public-label mixture), Accountant("sound") on CheckIn, and the same
    #       computed independently with the analytic Gaussian delta (1e-3);
    #   and below the exact delta of (y, N) (numerical integration), which
    #   upper-bounds the observer's delta.
    # It also compares with (b), the paper's Poisson(p)-amplified Gaussian
    # (dp_accounting): at p = 0.5 only K = 1 beats it; for K >= 2 the exact
    # (y, N) delta itself is below (b) here (asserted, as documentation).
    # 400,000 rounds per world; confidence 0.999 (false alarm <= 1e-3 each).
    from dpfl.accounting.accountant import Accountant
    from dpfl.accounting.events import CheckIn, Gaussian

    p, sigma, n = 0.5, 2.0, 400_000
    for clients in (1, 2, 3, 5):
        rng = np.random.default_rng(300 + clients)
        xa = _ms_pafl_round(rng, n, clients, +1.0, p, sigma)
        xb = _ms_pafl_round(rng, n, clients, -1.0, p, sigma)
        for eps in (0.5, 1.0):
            mine = p * gaussian_delta(2.0 / sigma, eps)
            sound = (
                Accountant("sound")
                .compose(CheckIn(p, Gaussian(sigma)), count=1)
                .delta(eps)
                .upper
            )
            assert sound == pytest.approx(mine, rel=1e-3), (eps, sound, mine)
            paper = _subsampled_gaussian_delta(sigma / 2, p, eps)
            exact = _ms_pafl_count_revealed_delta(clients, p, sigma, eps)
            r = delta_lower_bound(xa, xb, eps, confidence=CONFIDENCE, bins=0)
            assert r.delta_lower <= min(sound, mine, exact), (clients, eps, r)
            if clients == 1:
                # observer = server: the count is the target's check-in
                assert r.delta_lower > paper, (eps, r, paper)
            else:
                assert exact < paper, (clients, eps, exact, paper)


def test_ms_pafl_observer_beats_paper_amplification_at_small_p():
    # Documents that the paper's amplification by the check-in probability p
    # (Poisson(p)-subsampled Gaussian, mu = 2/sigma, dp_accounting) is not
    # valid for the observer of g_hat: with K = 2 clients, p = 0.1, sigma = 2,
    # eps = 0.5, the count read off ||g_hat||^2 leaves only "which of the two"
    # hidden (amplification by about 1/2 instead of p). The Monte-Carlo lower
    # bound (projection and count-aware likelihood ratio, 1,000,000 rounds per
    # world, confidence 0.999) exceeds the paper's delta, refuting it with
    # error probability <= 1e-3; it stays below dpfl's sound pricing and the
    # exact (y, N) delta (false alarm <= 1e-3 each).
    p, sigma, clients, eps, n = 0.1, 2.0, 2, 0.5, 1_000_000
    rng = np.random.default_rng(404)
    xa = _ms_pafl_round(rng, n, clients, +1.0, p, sigma)
    xb = _ms_pafl_round(rng, n, clients, -1.0, p, sigma)
    paper = _subsampled_gaussian_delta(sigma / 2, p, eps)
    sound = p * gaussian_delta(2.0 / sigma, eps)
    exact = _ms_pafl_count_revealed_delta(clients, p, sigma, eps)
    r = delta_lower_bound(xa, xb, eps, confidence=CONFIDENCE, bins=0)
    assert paper < r.delta_lower <= min(exact, sound), (r, paper, exact, sound)


# ---------------------------------------------------------------------------
# B.4 random participation, untrusted server: only participants send
# ---------------------------------------------------------------------------


def _rp_message(
    rng: np.random.Generator,
    n: int,
    with_record: bool,
    p: float,
    q: float,
    companions: int,
    aligned: bool,
    sigma: float,
) -> np.ndarray:
    """The target client's message projected on x' (-inf when it did not send).

    The client participates w.p. p (then, and only then, it sends); each of
    its records joins w.p. q; the message is the sum of the sampled records'
    clipped gradients plus N(0, sigma^2 I) (C = 1). The target record's
    gradient is x' (unit); the companions' gradients are 0 or x' (aligned).
    """
    sent = rng.random(n) < p
    x = sigma * rng.standard_normal(n)
    if with_record:
        x += rng.random(n) < q
    if aligned:
        x += rng.binomial(companions, q, n)
    return np.where(sent, x, -np.inf)


def test_random_participation_untrusted_server_sees_participation():
    # Checks, for p = 0.3, q = 0.5, d = 1 companion record, sigma = 1,
    # record-level add/remove of x': the Monte-Carlo lower bound (statistic:
    # the message projected on x', -inf when the client did not send, and its
    # binned likelihood ratio) is
    #   - <= dpfl's round_delta(analysis="wcs") (participation visible: w.p. p
    #     the rate-q subsampled Gaussian; with zero companions this is the
    #     exact delta, and the bound comes within 20% of it at eps = 0.5);
    #   - > dpfl's round_delta(analysis="sound"), which assumes participation
    #     is hidden (trusted server adding the noise), so it does not apply
    #     when participants add their own noise: asserted as documentation at
    #     eps = 0.5 for zero and aligned companions and at eps = 1 for zero.
    # 1,000,000 rounds per world; confidence 0.999: "<= wcs" false alarm
    # <= 1e-3 each, "> sound" wrong w.p. <= 1e-3 each.
    from dpfl.accounting.participation import round_delta

    p, q, d, sigma, n = 0.3, 0.5, 1, 1.0, 1_000_000
    for aligned in (False, True):
        rng = np.random.default_rng(505)
        a = _rp_message(rng, n, True, p, q, d, aligned, sigma)
        b = _rp_message(rng, n, False, p, q, d, aligned, sigma)
        for eps in (0.5, 1.0):
            kw = dict(
                participation_probability=p,
                record_probability=q,
                records_per_client=d,
                noise_multiplier=sigma,
            )
            wcs = round_delta(eps, analysis="wcs", **kw)
            sound = round_delta(eps, analysis="sound", **kw)
            r = delta_lower_bound(a, b, eps, confidence=CONFIDENCE)
            assert r.delta_lower <= wcs, (aligned, eps, r, wcs)
            if not aligned and eps == 0.5:
                # zero companions: wcs is exact and the attack gets close
                # (about 0.95 of it here; about 0.85 at eps = 1)
                assert r.delta_lower >= 0.8 * wcs, (eps, r, wcs)
            if not aligned or eps == 0.5:
                assert r.delta_lower > sound, (aligned, eps, r, sound)
