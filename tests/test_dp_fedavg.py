"""Client-level DP-FedAvg (Geyer et al. 2017; docs/analyses.md)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dpfl.accounting import events as ev
from dpfl.accounting import rdp
from dpfl.accounting.accountant import Accountant
from dpfl.accounting.ledger import Budget, PrivacyLedger
from dpfl.data import FederatedDataset, federate, load_digits
from dpfl.errors import BudgetExceededError, InvalidParameterError
from dpfl.sim.algorithms.dp_fedavg import (
    DpFedAvg,
    MomentsAccountantLedger,
    between_client_variance,
    schedule_value,
    update_scale,
)
from dpfl.sim.loop import Trainer, round_generators


@pytest.fixture(scope="module")
def digits_iid() -> FederatedDataset:
    """Embedded digits, 20 clients of unequal size (67-68 records each)."""
    d = load_digits(flatten=True)
    return federate(
        d.features,
        d.labels,
        partition="iid",
        num_clients=20,
        seed=0,
        test_features=d.test_features,
        test_labels=d.test_labels,
    )


def small_dataset(sizes: list[int], seed: int = 0) -> FederatedDataset:
    """Random 8-feature, 3-class data with the given client sizes."""
    g = np.random.default_rng(seed)
    n = sum(sizes)
    x = g.normal(size=(n, 8)).astype(np.float32)
    y = g.integers(0, 3, size=n).astype(np.int64)
    bounds = np.cumsum([0, *sizes])
    idx = [np.arange(a, b, dtype=np.int64) for a, b in zip(bounds[:-1], bounds[1:])]
    return FederatedDataset(
        features=x, labels=y, client_indices=idx, num_classes=3, name="toy"
    )


def mlp(in_features: int = 8, classes: int = 3, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(in_features, 16), nn.Tanh(), nn.Linear(16, classes))


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


# ------------------------------------------------------------------ schedules
def test_schedule_value_constant_list_and_ramp() -> None:
    # Source: the definition in the module docstring (exact values).
    assert schedule_value(7, 3, name="m") == 7.0
    assert [schedule_value([5, 6, 9], t, name="m") for t in range(5)] == [
        5.0,
        6.0,
        9.0,
        9.0,
        9.0,
    ]
    ramp = {"start": 1.0, "stop": 2.0, "rounds": 5}
    assert [schedule_value(ramp, t, name="s") for t in (0, 2, 4, 9)] == [
        1.0,
        1.5,
        2.0,
        2.0,
    ]
    with pytest.raises(InvalidParameterError, match="ramp"):
        schedule_value({"start": 1.0}, 0, name="s")
    with pytest.raises(InvalidParameterError, match="empty"):
        schedule_value([], 0, name="m")


# --------------------------------------------------- a short run and its ledger
def test_short_seeded_run_records_one_event_per_round(
    digits_iid: FederatedDataset,
) -> None:
    # Prepare: schedules for m_t (list) and sigma_t (linear ramp).
    cohorts = [4, 6, 8]
    ramp = {"start": 3.0, "stop": 4.0, "rounds": 3}

    def make() -> Trainer:
        alg = DpFedAvg(
            model=mlp(64, 10),
            dataset=digits_iid,
            cohort_size=cohorts,
            noise_multiplier=ramp,
            local_epochs=1,
            batch_size=10,
            learning_rate=0.1,
            clip=1.0,
        )
        return Trainer(alg, ledger=PrivacyLedger(None, analysis="sound"), seed=3)

    # Execute
    trainer = make()
    reports = trainer.run(3)
    again = make()
    again.run(3)

    # Assert: one FixedCohort event per round with the scheduled (m_t, σ_t).
    expected = [
        ev.FixedCohort(4, 20, ev.Gaussian(3.0)),
        ev.FixedCohort(6, 20, ev.Gaussian(3.5)),
        ev.FixedCohort(8, 20, ev.Gaussian(4.0)),
    ]
    assert [e.event for e in trainer.ledger.entries] == expected
    assert [e.round for e in trainer.ledger.entries] == [0, 1, 2]
    assert [len(r.participants) for r in reports] == cohorts
    assert reports[-1].metrics["communication_cost"] == sum(cohorts)
    assert all(r.metrics["clip_bound_private"] == 1.0 for r in reports)
    # Seeded: the same seed gives the same model, bit for bit.
    assert torch.equal(
        flat_params(trainer.algorithm.model), flat_params(again.algorithm.model)
    )
    assert trainer.algorithm.evaluate().keys() == {"test_loss", "test_accuracy"}


def test_reported_epsilon_matches_accountant_and_rdp_module(
    digits_iid: FederatedDataset,
) -> None:
    # Prepare: a heterogeneous schedule (m_t differs each round).
    cohorts = [4, 6, 8]
    sigma = 3.0
    alg = DpFedAvg(
        model=mlp(64, 10),
        dataset=digits_iid,
        cohort_size=cohorts,
        noise_multiplier=sigma,
        clip=1.0,
    )
    trainer = Trainer(alg, ledger=PrivacyLedger(None, analysis="sound"), seed=0)

    # Execute
    trainer.run(3)
    sound = trainer.ledger.epsilon(1e-5)
    paper = trainer.ledger.epsilon(1e-5, analysis="paper-pld")

    # Assert 1: the ledger's ε is the Accountant's for events built here from
    # the schedule (same engine: equal to 1e-12).
    acc = Accountant("sound")
    for m in cohorts:
        acc.compose(ev.FixedCohort(m, 20, ev.Gaussian(sigma)))
    assert sound.upper == pytest.approx(acc.epsilon(1e-5).upper, rel=1e-12)
    # Assert 2: independent computations in dpfl.accounting.rdp (its own PLD
    # construction at a fixed 1e-4 grid): "sound" = C_{m/K}(G_{2/σ}) symmetrised,
    # "paper-pld" = the Poisson reading. The Accountant refines to a 2 %
    # bracket, so agree within 3 %.
    for bound, analysis in ((sound, "sound"), (paper, "paper-pld")):
        ref = rdp.dp_fedavg_epsilon(
            delta=1e-5,
            clients=20,
            cohort_sizes=cohorts,
            noise_multipliers=sigma,
            analysis=analysis,
        )
        assert bound.upper == pytest.approx(ref, rel=0.03)
    # The sound (replace-one, WOR) bound is the larger one: the Poisson reading
    # under-prices a fixed cohort.
    assert sound.upper > paper.upper


# -------------------------------------------------------------- stopping at Q
def test_median_clipping_stops_at_q_where_the_moments_accountant_says(
    digits_iid: FederatedDataset,
) -> None:
    # Prepare: K = 20, m = 10, σ = 0.8, ε = 8, Q = 1e-3 (Algorithm 1's rule).
    k, m, sigma, eps, q = 20, 10, 0.8, 8.0, 1e-3
    stop = rdp.dp_fedavg_stop_round(
        epsilon=eps,
        threshold=q,
        clients=k,
        cohort_sizes=m,
        noise_multipliers=sigma,
        max_rounds=100,
        analysis="paper",
    )
    assert stop == 4  # Abadi et al.'s rule: first round with δ > Q
    alg = DpFedAvg(
        model=mlp(64, 10),
        dataset=digits_iid,
        cohort_size=m,
        noise_multiplier=sigma,
        clipping="median",
        learning_rate=0.05,
    )
    ledger = MomentsAccountantLedger(Budget(epsilon=eps, delta=q))
    trainer = Trainer(alg, ledger=ledger, seed=1)

    # Execute: train until the guard refuses.
    released = 0
    with pytest.raises(BudgetExceededError):
        for _ in range(100):
            trainer.step()
            released += 1
    before = flat_params(alg.model)

    # Assert: exactly stop - 1 rounds released; δ(ε) after them <= Q, after one
    # more > Q (the rdp module's own numbers).
    assert released == stop - 1
    assert ledger.rounds == stop - 1
    assert alg.communication_cost == (stop - 1) * m
    kw = {
        "epsilon": eps,
        "clients": k,
        "cohort_sizes": m,
        "noise_multipliers": sigma,
        "analysis": "paper",
    }
    assert rdp.dp_fedavg_delta(rounds=stop - 1, **kw) <= q
    assert rdp.dp_fedavg_delta(rounds=stop, **kw) > q
    # The refused round changed nothing.
    with pytest.raises(BudgetExceededError):
        trainer.step()
    assert torch.equal(before, flat_params(alg.model))
    assert "median" in alg.unproven and "not charged" in alg.unproven


def test_ledger_paper_guard_stops_where_the_pld_poisson_reading_says(
    digits_iid: FederatedDataset,
) -> None:
    # The Accountant's "paper-pld" analysis prices FixedCohort as Poisson(m/K)
    # with a tight PLD, i.e. rdp's "paper-pld" (not its RDP "paper"): at
    # K=20, m=10, σ=0.7, ε=8, Q=1e-3 the PLD stops at round 5, the RDP rules
    # at 4.
    k, m, sigma, eps, q = 20, 10, 0.7, 8.0, 1e-3
    kw = {
        "epsilon": eps,
        "threshold": q,
        "clients": k,
        "cohort_sizes": m,
        "noise_multipliers": sigma,
        "max_rounds": 50,
    }
    stop_pld = rdp.dp_fedavg_stop_round(analysis="paper-pld", **kw)
    assert (stop_pld, rdp.dp_fedavg_stop_round(analysis="paper-rdp", **kw)) == (5, 4)
    alg = DpFedAvg(
        model=mlp(64, 10),
        dataset=digits_iid,
        cohort_size=m,
        noise_multiplier=sigma,
        clipping="median",
    )
    trainer = Trainer(
        alg, ledger=PrivacyLedger(Budget(eps, q), analysis="paper-pld"), seed=0
    )
    with pytest.raises(BudgetExceededError):
        trainer.run(50)
    assert trainer.ledger.rounds == stop_pld - 1


# ------------------------------------------------- batched cohort vs a loop
def test_batched_cohort_equals_per_client_loop() -> None:
    # Prepare: unequal client sizes (padding + masks), 2 epochs, batch 4.
    ds = small_dataset([7, 3, 10, 5, 1])
    kw = {
        "dataset": ds,
        "cohort_size": 4,
        "noise_multiplier": None,
        "local_epochs": 2,
        "batch_size": 4,
        "learning_rate": 0.3,
    }
    batched = DpFedAvg(model=mlp(), execution="batched", **kw)
    loop = DpFedAvg(model=mlp(), execution="loop", **kw)
    plan = batched.plan_round(0, np.random.default_rng(7))

    # Execute
    ub = batched.client_updates(plan)
    ul = loop.client_updates(plan)

    # Independent witness: torch.optim.SGD on a copy of the model, per client,
    # visiting the records in the plan's order.
    model0 = mlp()
    start = flat_params(model0)
    witness = []
    for j, client in enumerate(plan.sample.clients):
        x, y = ds.client(int(client))
        net = copy.deepcopy(model0)
        opt = torch.optim.SGD(net.parameters(), lr=0.3)
        for epoch in range(2):
            order = plan.orders[epoch, j]
            order = order[order >= 0]
            for s in range(0, len(order), 4):
                sel = order[s : s + 4]
                opt.zero_grad()
                F.cross_entropy(
                    net(torch.as_tensor(x[sel])), torch.as_tensor(y[sel])
                ).backward()
                opt.step()
        witness.append(flat_params(net) - start)
    witness_t = torch.stack(witness)

    # Assert: float32 arithmetic in different orders; atol 1e-5.
    assert ub.shape == (4, start.numel())
    torch.testing.assert_close(ub, witness_t, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ul, witness_t, atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------ V_c and U_s
def test_vc_us_against_the_papers_definition() -> None:
    # Source: Geyer §3 definitions, written out with explicit loops over a
    # q×p = 3×4 update matrix of K = 5 clients; exact to 1e-12.
    g = np.random.default_rng(0)
    w = g.normal(size=(5, 3, 4))
    kk, qq, pp = w.shape
    mu = [
        [sum(w[k, i, j] for k in range(kk)) / kk for j in range(pp)] for i in range(qq)
    ]
    var = [
        [sum((w[k, i, j] - mu[i][j]) ** 2 for k in range(kk)) / kk for j in range(pp)]
        for i in range(qq)
    ]
    vc = sum(sum(r) for r in var) / (qq * pp)
    us = sum(mu[i][j] ** 2 for i in range(qq) for j in range(pp)) / (qq * pp)
    flat = w.reshape(kk, -1)
    assert between_client_variance(flat) == pytest.approx(vc, rel=1e-12)
    assert update_scale(torch.as_tensor(flat)) == pytest.approx(us, rel=1e-12)
    with pytest.raises(InvalidParameterError):
        between_client_variance(np.zeros((0, 3)))


def test_round_metrics_match_numpy_on_the_round_updates(
    digits_iid: FederatedDataset,
) -> None:
    # Prepare: two identical algorithms; one only plans and trains locally.
    kw = {
        "dataset": digits_iid,
        "cohort_size": 6,
        "noise_multiplier": 2.0,
        "clipping": "median",
        "learning_rate": 0.1,
    }
    probe = DpFedAvg(model=mlp(64, 10), **kw)
    alg = DpFedAvg(model=mlp(64, 10), **kw)
    rng, gen = round_generators(5, 0)
    rng2, gen2 = round_generators(5, 0)

    # Execute
    updates = probe.client_updates(probe.plan_round(0, rng)).double().numpy()
    _, metrics = alg.run_round(0, rng2, gen2)

    # Assert: numpy's population variance / mean square, and np.median of the
    # norms as the clipping bound (rel 1e-5: float32 updates).
    norms = np.linalg.norm(updates, axis=1)
    assert metrics["between_client_variance"] == pytest.approx(
        np.var(updates, axis=0).mean(), rel=1e-5
    )
    assert metrics["update_scale"] == pytest.approx(
        np.mean(updates.mean(0) ** 2), rel=1e-5
    )
    assert metrics["clip_bound"] == pytest.approx(np.median(norms), rel=1e-5)
    assert metrics["clipped_fraction"] == pytest.approx(
        np.mean(norms > np.median(norms))
    )
    assert metrics["clip_bound_private"] == 0.0
    assert metrics["noise_std"] == pytest.approx(2.0 * np.median(norms), rel=1e-5)


# ----------------------------------------------------- the server's average
def test_fixed_clipping_average_and_noise(digits_iid: FederatedDataset) -> None:
    # w_{t+1} - w_t = (Σ clip_S(Δw_k) + N(0, σ²S² I)) / m (Alg. 1 line 10).
    kw = {"dataset": digits_iid, "cohort_size": 5, "clip": 0.05, "learning_rate": 0.1}
    probe = DpFedAvg(model=mlp(64, 10), noise_multiplier=None, **kw)
    alg = DpFedAvg(model=mlp(64, 10), noise_multiplier=None, **kw)
    noisy = DpFedAvg(model=mlp(64, 10), noise_multiplier=1.5, **kw)
    u = probe.client_updates(probe.plan_round(0, np.random.default_rng(1))).double()
    clipped = u * (0.05 / u.norm(dim=1)).clamp(max=1.0)[:, None]
    w0 = flat_params(alg.model).double()

    alg.run_round(0, np.random.default_rng(1), torch.Generator().manual_seed(0))
    noisy.run_round(0, np.random.default_rng(1), torch.Generator().manual_seed(0))

    # Non-private: exact average (float32 → atol 1e-7).
    step = flat_params(alg.model).double() - w0
    torch.testing.assert_close(step, clipped.sum(0) / 5, atol=1e-7, rtol=1e-5)
    # Private: the residual is noise of std σS/m per coordinate; with P = 1,210
    # coordinates the sample std lies within ±10 % of 0.015 (chi-square, > 5 SD).
    resid = flat_params(noisy.model).double() - w0 - clipped.sum(0) / 5
    assert resid.numel() == 1210
    assert float(resid.std()) == pytest.approx(1.5 * 0.05 / 5, rel=0.10)


def test_poisson_sampling_divides_by_expected_cohort(
    digits_iid: FederatedDataset,
) -> None:
    kw = {
        "dataset": digits_iid,
        "cohort_size": 5,
        "sampling": "poisson",
        "clip": 0.05,
    }
    probe = DpFedAvg(model=mlp(64, 10), noise_multiplier=None, **kw)
    alg = DpFedAvg(model=mlp(64, 10), noise_multiplier=None, **kw)
    private = DpFedAvg(model=mlp(64, 10), noise_multiplier=2.0, **kw)
    assert private.event() == ev.ClientPoisson(0.25, ev.Gaussian(2.0))
    assert alg.event() is None
    plan = probe.plan_round(0, np.random.default_rng(11))
    u = probe.client_updates(plan).double()
    clipped = u * (0.05 / u.norm(dim=1)).clamp(max=1.0)[:, None]
    w0 = flat_params(alg.model).double()
    parts, metrics = alg.run_round(0, np.random.default_rng(11), torch.Generator())
    step = flat_params(alg.model).double() - w0
    # Divided by the expected m = 5, not the realised cohort.
    torch.testing.assert_close(step, clipped.sum(0) / 5, atol=1e-7, rtol=1e-5)
    assert metrics["participants"] == len(parts) == plan.sample.num_clients


# --------------------------------------------------------- adaptive clipping
def test_adaptive_clipping_noise_split_and_geometric_update() -> None:
    ds = small_dataset([6] * 10)
    # Closed form (Andrew et al. 2021, Thm 1): σ_Δ^-2 + (2σ_b)^-2 = σ^-2.
    alg = DpFedAvg(
        model=mlp(),
        dataset=ds,
        cohort_size=5,
        noise_multiplier=1.0,
        clipping="adaptive",
        count_noise_multiplier=2.0,
        clip=100.0,
        clip_learning_rate=0.2,
        target_quantile=0.5,
    )
    s_update = alg._update_noise_multiplier(1.0, 5)
    assert s_update**-2 + (2 * 2.0) ** -2 == pytest.approx(1.0, rel=1e-12)
    assert alg.event() == ev.FixedCohort(5, 10, ev.Gaussian(1.0))
    _, metrics = alg.run_round(0, np.random.default_rng(0), torch.Generator())
    assert metrics["noise_std"] == pytest.approx(s_update * 100.0, rel=1e-12)

    # Without noise, all updates under C: b̃ = 1 and C ← C·exp(-η(1 - γ)).
    quiet = DpFedAvg(
        model=mlp(),
        dataset=ds,
        cohort_size=5,
        noise_multiplier=None,
        clipping="adaptive",
        clip=100.0,
    )
    _, m2 = quiet.run_round(0, np.random.default_rng(0), torch.Generator())
    assert m2["noisy_fraction_under"] == pytest.approx(1.0)
    assert quiet.clip_bound == pytest.approx(100.0 * math.exp(-0.2 * 0.5), rel=1e-12)

    with pytest.raises(InvalidParameterError, match="count_noise_multiplier"):
        DpFedAvg(
            model=mlp(),
            dataset=ds,
            cohort_size=5,
            noise_multiplier=3.0,
            clipping="adaptive",
            count_noise_multiplier=1.0,
        )


# ------------------------------------------------------------- state, errors
def test_resume_from_state_dict_continues_exactly(
    digits_iid: FederatedDataset,
) -> None:
    kw = {
        "dataset": digits_iid,
        "cohort_size": 4,
        "noise_multiplier": 3.0,
        "clipping": "adaptive",
        "count_noise_multiplier": 4.0,
        "clip": 0.5,
    }
    full = Trainer(DpFedAvg(model=mlp(64, 10), **kw), ledger=PrivacyLedger(), seed=2)
    full.run(3)
    first = Trainer(DpFedAvg(model=mlp(64, 10), **kw), ledger=PrivacyLedger(), seed=2)
    first.run(2)
    state = first.state_dict()
    ledger = first.ledger
    resumed = Trainer(DpFedAvg(model=mlp(64, 10, seed=9), **kw), ledger=ledger, seed=2)
    resumed.load_state_dict(state)
    resumed.step()
    assert torch.equal(
        flat_params(full.algorithm.model), flat_params(resumed.algorithm.model)
    )
    assert resumed.algorithm.clip_bound == full.algorithm.clip_bound
    assert resumed.algorithm.communication_cost == 12


def test_invalid_parameters_name_themselves(digits_iid: FederatedDataset) -> None:
    with pytest.raises(InvalidParameterError, match="clipping"):
        DpFedAvg(model=mlp(64, 10), dataset=digits_iid, cohort_size=2, clipping="x")
    with pytest.raises(InvalidParameterError, match="cohort_size"):
        DpFedAvg(model=mlp(64, 10), dataset=digits_iid, cohort_size=21)
    with pytest.raises(InvalidParameterError, match="noise_multiplier"):
        DpFedAvg(
            model=mlp(64, 10),
            dataset=digits_iid,
            cohort_size=2,
            noise_multiplier=[1.0, -1.0],
        ).plan_round(1, np.random.default_rng(0))
