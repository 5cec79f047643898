import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpfl.accounting import events as ev
from dpfl.accounting.accountant import Accountant
from dpfl.accounting.events import Gaussian, PoissonSampled
from dpfl.accounting.ledger import Budget, PrivacyLedger
from dpfl.accounting.pricing import canonical
from dpfl.errors import (
    BudgetExceededError,
    DpflError,
    InvalidParameterError,
    UnsupportedEventError,
)

EVENT = PoissonSampled(0.05, Gaussian(1.0))


def test_record_and_spend_matches_accountant():
    ledger = PrivacyLedger()
    for _ in range(20):
        ledger.record(EVENT)
    # The ledger prices exactly the composed events (same code path, same bound,
    # at the ledger's tolerance).
    direct = Accountant(tolerance=ledger.tolerance).compose(EVENT, 20).epsilon(1e-5)
    assert ledger.epsilon(1e-5) == direct


def test_budget_guard_stops_before_overspend():
    budget = Budget(epsilon=3.0, delta=1e-5)
    ledger = PrivacyLedger(budget)
    allowed = ledger.max_rounds(EVENT)
    assert allowed >= 1
    for _ in range(allowed):
        ledger.record(EVENT)
    assert ledger.epsilon().upper <= budget.epsilon
    with pytest.raises(BudgetExceededError, match="would exceed the budget"):
        ledger.record(EVENT)
    assert ledger.rounds == allowed  # the refused round was not recorded
    # and one more round really would have overspent (the guard is not over-cautious)
    assert Accountant().compose(EVENT, allowed + 1).epsilon(1e-5).upper > budget.epsilon


def test_heterogeneous_guard():
    ledger = PrivacyLedger(Budget(epsilon=1.5, delta=1e-5))
    ledger.record(PoissonSampled(0.01, Gaussian(2.0)))
    with pytest.raises(BudgetExceededError):
        ledger.record(Gaussian(0.5))


def test_atomic_save_and_load_roundtrip(tmp_path):
    path = tmp_path / "run" / "ledger.json"
    ledger = PrivacyLedger(Budget(4.0, 1e-5), path=path)
    checkin = ev.CheckIn(0.5, Gaussian(4.0))  # charged per participant
    ledger.record(checkin, participants=[3, 7])
    ledger.record(checkin, participants=[7])
    ledger.save()
    assert not [
        p for p in path.parent.iterdir() if p.name.startswith(".")
    ]  # no temp left
    loaded = PrivacyLedger.load(path)
    assert loaded.to_json() == ledger.to_json()
    assert loaded.client_rounds(7) == 2 and loaded.client_rounds(3) == 1
    assert loaded.client_epsilon(3).upper < loaded.client_epsilon(7).upper
    assert json.loads(path.read_text())["entries"][0]["participants"] == [3, 7]


def test_load_errors(tmp_path):
    with pytest.raises(DpflError, match="not found"):
        PrivacyLedger.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(DpflError, match="not a dpfl ledger"):
        PrivacyLedger.load(bad)


def test_per_client_spend_counts_the_worst_clients_rounds():
    # Check-in (sound) charges one participant's release, so a client pays only
    # for the rounds it joined: the run's epsilon is the most frequent client's.
    # Witness: the Gaussian-DP closed form of n releases of sensitivity 2C
    # (replace-one) at noise 4C, mu = 2 sqrt(n) / 4 (exact; rel 1e-12).
    from dpfl.accounting import gaussian
    from dpfl.accounting.events import CheckIn, ClientPoisson

    release = CheckIn(0.5, Gaussian(4.0))

    def joined(n):
        return gaussian.gdp_epsilon(1e-5, mu=2.0 * n**0.5 / 4.0)

    ledger = PrivacyLedger()
    for parts in ([1, 2], [2], [2, 3], [3]):
        ledger.record(release, participants=parts)
    assert ledger.epsilon(1e-5).upper == pytest.approx(joined(3), rel=1e-12)
    assert ledger.worst_unit(1e-5)[0] == 2  # client 2 joined 3 rounds
    assert ledger.client_epsilon(1, 1e-5).upper == pytest.approx(joined(1), rel=1e-12)
    # A client named twice in one round took part once: client 1 below joined
    # one round and client 2 two, so the worst client is 2.
    ledger = PrivacyLedger()
    for parts in ([1, 2, 1], [2]):
        ledger.record(release, participants=parts)
    assert ledger.epsilon(1e-5).upper == pytest.approx(joined(2), rel=1e-12)
    # Under the paper's reading every round is amplified and counts for all.
    assert ledger.epsilon(1e-5, analysis="paper") == Accountant(
        "paper", tolerance=ledger.tolerance
    ).compose(release, 2).epsilon(1e-5)
    # An event that already prices client sampling holds for everyone every round.
    sampled = ClientPoisson(0.5, Gaussian(4.0))
    ledger = PrivacyLedger()
    for parts in ([1], [2], [3]):
        ledger.record(sampled, participants=parts)
    assert ledger.epsilon(1e-5) == Accountant(tolerance=ledger.tolerance).compose(
        sampled, 3
    ).epsilon(1e-5)


def test_flush_appends_a_journal_and_load_replays_it(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger(Budget(50.0, 1e-5), path=path)
    for k in range(5):
        ledger.record(EVENT, participants=[k])
        ledger.flush()
    journal = path.with_name("ledger.json.journal")
    # The snapshot was written once; later rounds went to the journal.
    assert len(json.loads(path.read_text())["entries"]) == 1
    assert len(journal.read_text().splitlines()) == 4
    assert PrivacyLedger.load(path).to_json() == ledger.to_json()
    # A crash mid-line loses only that line (its round was never checkpointed).
    with journal.open("a") as fh:
        fh.write('{"seq": 5, "round": 5, "ev')
    assert PrivacyLedger.load(path).rounds == 5
    # save() compacts: everything in the snapshot, no journal.
    reloaded = PrivacyLedger.load(path)
    reloaded.record(EVENT)
    reloaded.flush()
    assert not journal.exists()
    assert PrivacyLedger.load(path).rounds == 6


# ----------------------------------------------------- the guard survives a reload
def test_moments_accountant_guard_survives_save_and_load(tmp_path):
    # A ledger with the moments-accountant guard saved (snapshot) and flushed
    # (journal) comes back from PrivacyLedger.load with that guard and refuses
    # the round that rdp.dp_fedavg_stop_round(analysis="paper") names: the
    # paper's RDP rule, not the PLD guard a plain ledger would use (which
    # allows more rounds here; see the second assertion).
    from dpfl.accounting import rdp
    from dpfl.accounting.guards import MomentsAccountantGuard

    k, m, sigma, eps, q = 20, 10, 0.7, 8.0, 1e-3
    stop = rdp.dp_fedavg_stop_round(
        epsilon=eps,
        threshold=q,
        clients=k,
        cohort_sizes=m,
        noise_multipliers=sigma,
        max_rounds=100,
        analysis="paper",
    )
    event = ev.FixedCohort(m, k, ev.Gaussian(sigma))
    plain = PrivacyLedger(Budget(eps, q), analysis="paper-pld")
    assert plain.max_rounds(event, limit=100) > stop - 1  # PLD allows more
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger(Budget(eps, q), path=path, guard=MomentsAccountantGuard())
    ledger.record(event)
    ledger.save()
    for _ in range(stop - 3):
        ledger.record(event)
    ledger.flush()  # the rest in the journal
    back = PrivacyLedger.load(path)
    assert isinstance(back.stop_rule, MomentsAccountantGuard)
    assert back.analysis == "paper"
    assert back.rounds == stop - 2 and back.to_json()["guard"] == "moments-accountant"
    back.check(event)  # round stop - 1 is allowed ...
    back.record(event)
    with pytest.raises(BudgetExceededError, match="moments-accountant stop rule"):
        back.check(event)  # ... round `stop` is refused
    # A plain ledger's file loads with the Accountant's guard; a file naming
    # an unknown guard is refused with the names known.
    plain.save(tmp_path / "plain.json")
    assert PrivacyLedger.load(tmp_path / "plain.json").guard == "accountant"
    data = json.loads((tmp_path / "plain.json").read_text())
    data["guard"] = "bogus"
    (tmp_path / "bogus.json").write_text(json.dumps(data))
    with pytest.raises(DpflError, match="guard must be one of"):
        PrivacyLedger.load(tmp_path / "bogus.json")


@pytest.mark.parametrize("switch_at", [None, 100])
def test_moments_accountant_guard_stops_where_the_full_history_does(switch_at):
    # The guard reads the history incrementally and prices a homogeneous run
    # as T + 1 rounds of one (K, m, σ). Reference: moments_delta over the
    # explicit list of every round, recomputed each round. Both must refuse
    # the same round, with σ fixed or switching from 1.0 to 1.2 at round 100
    # (then the guard composes the whole heterogeneous history).
    from dpfl.accounting.guards import MomentsAccountantGuard

    k, m, eps, q = 100, 10, 8.0, 1e-3

    def event_at(t):
        sigma = 1.0 if switch_at is None or t < switch_at else 1.2
        return ev.FixedCohort(m, k, ev.Gaussian(sigma))

    rule = MomentsAccountantGuard()
    ledger = PrivacyLedger(Budget(eps, q), guard=rule)
    history = []
    expected_stop = None
    for t in range(1000):
        if rule.moments_delta(eps, [*history, event_at(t)]) > q:
            expected_stop = t
            break
        history.append(event_at(t))
    assert expected_stop is not None and expected_stop > (switch_at or 0) + 5
    for t in range(expected_stop):
        ledger.record(event_at(t))
    with pytest.raises(BudgetExceededError, match="moments-accountant stop rule"):
        ledger.check(event_at(expected_stop))
    assert ledger.rounds == expected_stop


def test_guards_are_named_and_take_their_analysis_from_the_scheme_table():
    from dpfl.accounting import guards, schemes
    from dpfl.accounting.ledger import Guard

    assert type(guards.guard("accountant")) is Guard
    assert isinstance(guards.guard("moments-accountant"), guards.MomentsAccountantGuard)
    assert isinstance(guards.guard("rdp"), guards.RdpGuard)
    with pytest.raises(InvalidParameterError, match="guard must be one of"):
        guards.guard("bogus")
    # the analysis each applies is the one the fixed-cohort scheme lists
    assert guards.guard("moments-accountant").analysis == "paper"
    assert guards.guard("rdp").analysis == "paper-rdp"
    assert dict(schemes.FIXED_COHORT.guards) == {
        "moments-accountant": "paper",
        "rdp": "paper-rdp",
    }
    # a scheme that lists no such guard refuses it, naming those it offers
    with pytest.raises(UnsupportedEventError, match=r"\['accountant'\]"):
        schemes.POISSON_SAMPLED.guard_analysis("moments-accountant")


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
def test_guard_prices_log_many_compositions_near_the_end_of_the_budget(monkeypatch):
    # A run calibrated to spend its budget in about T rounds used to price one
    # composition per round once past the last power of two below T (44 for
    # the T = 100 demo); the guard now bisects once it knows a count that
    # fails. Budget midway between the guard's own eps after 100 and 110
    # rounds (a gap far wider than its 2% bracket): it allows 100-109 rounds,
    # refuses the next, and prices at most 2*log2(128) + 2 compositions.
    event = PoissonSampled(0.05, Gaussian(1.2))
    ledger = PrivacyLedger(Budget(1.0, 1e-5))  # for its tolerance only
    e100 = ledger._epsilon_of(event, 100)
    e110 = ledger._epsilon_of(event, 110)
    assert e110 > e100 * 1.03
    ledger = PrivacyLedger(Budget(0.5 * (e100 + e110), 1e-5))
    calls = []
    original = PrivacyLedger._epsilon_of

    def counting(self, ev_, count):
        calls.append(count)
        return original(self, ev_, count)

    monkeypatch.setattr(PrivacyLedger, "_epsilon_of", counting)
    with pytest.raises(BudgetExceededError):
        for _ in range(200):
            ledger.check(event)
            ledger.record(event)
    assert 100 <= ledger.rounds < 110
    assert len(calls) <= 2 * 7 + 2, calls
    assert max(calls) <= 128  # never much longer than the run


def _reference_spend(ledger, analysis):
    # Who pays what, recomputed from scratch over the whole history: rounds of
    # per-participant schemes that name participants charge each of them its
    # own cost; every other round is charged to everyone.
    from collections import Counter

    from dpfl.accounting import costs, schemes

    common, units = Counter(), {}
    for entry in ledger.entries:
        if entry.participants is not None and schemes.per_participant(
            entry.event, analysis
        ):
            for unit, cost in costs.charges(
                entry.event, entry.participants, entry.extra
            ).items():
                units.setdefault(unit, Counter())[canonical(cost)] += 1
        else:
            common[canonical(entry.event)] += 1
    return common, units


_GUARD_EVENTS = [
    Gaussian(1.0),
    ev.SelfComposed(Gaussian(1.0), 1),  # canonicalises like Gaussian(1.0)
    Gaussian(2.0),
    ev.ClientPoisson(0.1, ev.RecordPoisson(0.5, 4, Gaussian(1.0))),  # all pay
    ev.CheckIn(0.3, Gaussian(2.0)),  # per participant (sound), all (paper)
]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(range(len(_GUARD_EVENTS))),
            st.none() | st.lists(st.integers(0, 4), max_size=4),
        ),
        max_size=12,
    )
)
def test_incremental_spend_matches_the_history_rule(history):
    # Random histories mixing events that price client sampling (everyone pays
    # every round), per-participant events, two spellings of one event, rounds
    # that name no participants, empty cohorts and a client named twice in a
    # round. Before and after every round, under both analyses of check-in,
    # the incremental summary holds exactly what the full-history rule does.
    ledger = PrivacyLedger()
    for i, participants in [(None, None), *history]:
        if i is not None:
            ledger.record(_GUARD_EVENTS[i], participants=participants)
        for analysis in (None, "paper"):
            spend = ledger._summary(analysis)
            common, units = _reference_spend(ledger, analysis)
            assert spend.common == common
            assert {k: v for k, v in spend.units.items() if v} == units


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
def test_guard_reads_each_recorded_round_once(monkeypatch):
    # 2,000 guarded rounds canonicalise O(1) events per round in all (the
    # summary reads only new entries), not the whole history every round
    # (about 2 million calls before). Counted, not timed.
    import dpfl.accounting.ledger as ledger_module

    calls = {"n": 0}
    real = ledger_module.canonical

    def counting(event):
        calls["n"] += 1
        return real(event)

    monkeypatch.setattr(ledger_module, "canonical", counting)
    ledger = PrivacyLedger(Budget(epsilon=1000.0, delta=1e-5))
    for _ in range(2_000):
        ledger.check(EVENT)  # as the Trainer does before each round
        ledger.record(EVENT)
    assert calls["n"] <= 4 * 2_000


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.integers(0, 6), st.sampled_from([0, 1, 2])), max_size=6),
        max_size=25,
    )
)
def test_incremental_front_matches_the_brute_force_rule(rounds):
    # Random two-stage-like histories: each round charges some units one of
    # three Gaussian costs. The incrementally kept frontier (non-dominated
    # profiles, each named by its smallest unit, in increasing order) equals
    # the one computed from scratch over every unit's charges; the guard's
    # front() is the frontier's profile of largest mu^2 (all costs Gaussian).
    from dpfl.accounting.spend import Spend, _dominated

    costs = [Gaussian(1.0), Gaussian(2.0), Gaussian(3.0)]
    spend = Spend(None)
    for charges in rounds:
        for unit, c in charges:
            spend._charge(unit, spend._intern(costs[c]))
    units = spend.units
    profiles = {}
    for unit in sorted(units):
        key = frozenset(units[unit].items())
        profiles.setdefault(key, (unit, units[unit]))
    expected = sorted(
        (u, c)
        for u, c in profiles.values()
        if not any(c != d and _dominated(c, d) for _, d in profiles.values())
    )
    got = spend.frontier()
    if not units:
        assert got == [(None, {})]
        return
    assert [(u, dict(c)) for u, c in got] == [(u, dict(c)) for u, c in expected]

    def mu2(c):
        return sum(n / e.noise_multiplier**2 for e, n in c.items())

    (worst,) = spend.front()
    # equal up to the order of a float sum over a Counter (a few ulps)
    assert mu2(worst) == pytest.approx(max(mu2(c) for _, c in expected), rel=1e-12)
