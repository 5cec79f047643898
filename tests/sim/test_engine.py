"""The engine: per-round generators, noise placement, executors, the Trainer."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from dpfl.accounting import events as ev
from dpfl.accounting.accountant import Accountant
from dpfl.accounting.ledger import Budget, PrivacyLedger
from dpfl.data import FederatedDataset
from dpfl.errors import BudgetExceededError, DpflError, InvalidParameterError
from dpfl.sim.algorithms.base import AlgorithmParams, FederatedAlgorithm
from dpfl.sim.algorithms.tasks import Cohort, Message, Task
from dpfl.sim.executors import executor
from dpfl.sim.loop import Trainer
from dpfl.sim.noise import gaussian_noise_like
from dpfl.sim.privatize import (
    CentralGaussian,
    ClientGaussian,
    NoiseOnlyMessages,
    Privatizer,
)
from dpfl.sim.randomness import client_streams, server_streams
from dpfl.sim.rounds import RoundReport
from dpfl.sim.secure_noise import fill_normal_

Z = 4.42  # two-sided normal quantile for a false-alarm rate of 1e-5
KEY = bytes(range(32))  # a fixed secure-noise key: two trainers, the same run


# ------------------------------------------------------------------- randomness
def test_server_streams_are_spawn_children_keyed_by_round():
    # SeedSequence(seed, spawn_key=(t,)) is the t-th child of SeedSequence(seed).spawn:
    # round t's numbers do not depend on how many rounds ran before.
    children = np.random.SeedSequence(42).spawn(6)
    for t in (0, 3, 5):
        expected = np.random.default_rng(children[t].spawn(2)[0]).random(4)
        assert np.array_equal(server_streams(42, t).rng.random(4), expected)
    a, b = server_streams(42, 3), server_streams(42, 3)
    assert np.array_equal(a.rng.random(5), b.rng.random(5))
    assert torch.equal(
        torch.randn(5, generator=a.generator), torch.randn(5, generator=b.generator)
    )
    c = server_streams(42, 4)
    assert not torch.equal(
        torch.randn(5, generator=c.generator), torch.randn(5, generator=a.generator)
    )
    with pytest.raises(InvalidParameterError, match="seed"):
        server_streams(-1, 0)


def test_client_streams_are_keyed_by_round_and_client_and_never_the_servers():
    draws = {
        (t, k): client_streams(9, t, k).rng.random(3).tobytes()
        for t in range(3)
        for k in range(4)
    }
    draws.update(
        {(t, "server"): server_streams(9, t).rng.random(3).tobytes() for t in range(3)}
    )
    assert len(set(draws.values())) == len(draws)  # all distinct
    again = client_streams(9, 2, 3)
    assert again.rng.random(3).tobytes() == draws[(2, 3)]
    with pytest.raises(InvalidParameterError, match="client"):
        client_streams(9, 0, -1)


# ----------------------------------------------------------------------- noise
def _gen(seed=0):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def test_gaussian_noise_like_has_the_requested_std():
    # 400,000 draws: the sample variance has relative std sqrt(2/n) = 0.22%;
    # accept |var/std^2 - 1| < Z * sqrt(2/n) (false-alarm rate 1e-5).
    params = {"w": torch.zeros(400, 500), "b": torch.zeros(200, dtype=torch.float64)}
    noise = gaussian_noise_like(params, 0.7, _gen())
    assert noise["b"].dtype == torch.float64 and noise["w"].shape == (400, 500)
    z = noise["w"].flatten()
    assert abs(float(z.var()) / 0.49 - 1) < Z * math.sqrt(2 / z.numel())
    assert abs(float(z.mean())) < Z * 0.7 / math.sqrt(z.numel())
    assert torch.equal(gaussian_noise_like(params, 0.0, _gen())["w"], params["w"])
    with pytest.raises(InvalidParameterError, match="std"):
        gaussian_noise_like(params, -1.0, _gen())


def test_noise_placements_total_std():
    # Closed forms: central σC; client sqrt(m) σ_c C; noise-only messages
    # sqrt(N) s with s = σC/sqrt(N) (secure aggregation) or s = σC.
    kw = dict(num_participants=9, num_available=100)
    assert CentralGaussian(noise_multiplier=1.5, clip=2.0).noise_std(**kw) == 3.0
    assert ClientGaussian(noise_multiplier=1.5, clip=2.0).noise_std(**kw) == 9.0
    sa = NoiseOnlyMessages(noise_multiplier=1.5, clip=2.0, secure_aggregation=True)
    assert sa.noise_std(**kw) == 3.0
    assert sa.message_std(num_available=100) == pytest.approx(0.3, rel=1e-15)
    local = NoiseOnlyMessages(noise_multiplier=1.5, clip=2.0, secure_aggregation=False)
    assert local.message_std(num_available=100) == 3.0
    assert local.noise_std(**kw) == pytest.approx(30.0, rel=1e-15)
    with pytest.raises(InvalidParameterError, match="num_participants"):
        sa.noise_std(num_participants=101, num_available=100)
    with pytest.raises(InvalidParameterError, match="noise_multiplier"):
        CentralGaussian(noise_multiplier=0.0, clip=1.0).noise_std(**kw)


def test_noise_only_messages_equal_materialised_messages_in_law():
    # The sum of N = 50 materialised N(0, s^2) messages per coordinate vs the
    # single draw of N(0, N s^2) used by add_noise: both variances must match
    # N s^2 = σ^2 C^2 = 4 within Z sample-variance standard errors
    # (false-alarm rate 1e-5 each).
    n, coords = 50, 100_000
    priv = NoiseOnlyMessages(noise_multiplier=2.0, clip=1.0, secure_aggregation=True)
    s = priv.message_std(num_available=n)
    g = _gen(1)
    messages = torch.randn(n, coords, generator=g, dtype=torch.float64) * s
    materialised = messages.sum(0)
    total = {"w": torch.zeros(coords, dtype=torch.float64)}
    drawn = priv.add_noise(total, num_participants=7, num_available=n, generator=g)["w"]
    for x in (materialised, drawn):
        assert abs(float(x.var()) / 4.0 - 1) < Z * math.sqrt(2 / coords)


def test_secure_noise_only_messages_match_central_noise_exactly():
    # Same generator state, same total std σC: bit-identical noisy sums.
    total = {"w": torch.randn(30, 7), "b": torch.randn(7)}
    a = CentralGaussian(noise_multiplier=1.3, clip=0.5).add_noise(
        total, num_participants=3, num_available=40, generator=_gen(9)
    )
    b = NoiseOnlyMessages(
        noise_multiplier=1.3, clip=0.5, secure_aggregation=True
    ).add_noise(total, num_participants=3, num_available=40, generator=_gen(9))
    assert all(torch.equal(a[k], b[k]) for k in total)
    assert not torch.equal(a["w"], total["w"])


def _flat_sums(shapes, dtype=torch.float32):
    """Sums as views into one flat buffer (the layout of clipped_grad_sum)."""
    flat = torch.randn(sum(math.prod(s) for s in shapes.values()), dtype=dtype)
    out, offset = {}, 0
    for name, shape in shapes.items():
        n = math.prod(shape)
        out[name] = flat[offset : offset + n].view(shape)
        offset += n
    return out


@pytest.mark.parametrize("layout", ["flat", "separate", "mixed dtypes"])
def test_add_noise_in_place_is_scaled_add_noise(layout):
    # add_noise_ draws the same noise as add_noise from the same generator
    # state and returns scale * (total + noise) in place, whether the sums
    # tile one flat buffer (one operation) or not.
    shapes = {"w": (30, 7), "b": (7,), "v": (3, 2, 5)}
    if layout == "flat":
        total = _flat_sums(shapes)
    else:
        total = {n: torch.randn(s) for n, s in shapes.items()}
        if layout == "mixed dtypes":
            total["b"] = total["b"].double()
    priv = CentralGaussian(noise_multiplier=1.3, clip=0.5)
    kw = dict(num_participants=3, num_available=40)
    want = priv.add_noise(total, generator=_gen(9), **kw)
    ids = {n: id(t) for n, t in total.items()}
    g = _gen(9)
    got = priv.add_noise_(total, generator=g, scale=0.25, **kw)
    assert got is total and all(id(t) == ids[n] for n, t in total.items())
    for n in shapes:
        assert got[n].dtype == want[n].dtype
        torch.testing.assert_close(got[n], 0.25 * want[n], rtol=1e-6, atol=1e-6)
    # The generator moved on exactly as add_noise moves it.
    h = _gen(9)
    priv.add_noise({n: t.clone() for n, t in total.items()}, generator=h, **kw)
    assert torch.equal(torch.randn(3, generator=g), torch.randn(3, generator=h))
    with pytest.raises(InvalidParameterError, match="scale"):
        priv.add_noise_(total, generator=g, scale=0.0, **kw)


def test_noise_drawn_in_the_background_equals_noise_drawn_now():
    # start_noise draws on a worker thread (CPU); the result is the same as
    # drawing at once, and the noisy sum is scale * total + N(0, (scale σC)²).
    priv = NoiseOnlyMessages(noise_multiplier=2.0, clip=0.5, secure_aggregation=True)
    kw = dict(num_participants=3, num_available=16, scale=0.5)
    shapes = {"w": (400, 250), "b": (250,)}
    base = _flat_sums(shapes)
    sums = {}
    for background in (True, False):
        total = {n: t.clone() for n, t in base.items()}
        pending = priv.start_noise(
            total, generator=_gen(3), background=background, **kw
        )
        sums[background] = pending.add_to_(total)
        with pytest.raises(InvalidParameterError, match="already"):
            pending.add_to_(total)
    assert all(torch.equal(sums[True][n], sums[False][n]) for n in shapes)
    z = (sums[True]["w"] - 0.5 * base["w"]).flatten()  # std 0.5 * σC = 0.5
    assert abs(float(z.var()) / 0.25 - 1) < Z * math.sqrt(2 / z.numel())
    pending = priv.start_noise(base, generator=_gen(3), **kw)
    pending.wait()
    with pytest.raises(InvalidParameterError, match="match"):
        pending.add_to_({"w": torch.zeros(400, 250)})


def test_zero_noise_std_only_scales():
    class Silent(Privatizer):
        def noise_std(self, *, num_participants: int, num_available: int) -> float:
            return 0.0

    total = _flat_sums({"w": (4, 3), "b": (3,)})
    want = {n: 2.0 * t for n, t in total.items()}
    g = _gen(1)
    state = g.get_state()
    out = Silent().add_noise_(
        total, num_participants=1, num_available=2, generator=g, scale=2.0
    )
    assert all(torch.equal(out[n], want[n]) for n in want)
    assert torch.equal(g.get_state(), state)  # nothing drawn


def test_client_gaussian_noise_messages_are_per_client():
    stacked = {"w": torch.zeros(4, 20_000)}
    out = ClientGaussian(noise_multiplier=0.5, clip=2.0).noise_messages(stacked, _gen())
    var = out["w"].var(dim=1)  # each client's noise std is σ_c C = 1
    assert torch.all((var - 1).abs() < Z * math.sqrt(2 / 20_000))


def test_executor_names():
    assert executor("loop").name == "loop" and executor("batched").name == "batched"
    # "ray" names the optional integration: built lazily, Ray not started.
    assert executor("ray").name == "ray"
    with pytest.raises(InvalidParameterError, match="execution"):
        executor("rays")


# ---------------------------------------------------------------------- trainer
class _StubParams(AlgorithmParams):
    pass


_StubParams = dataclasses.dataclass(frozen=True)(_StubParams)


def _stub_data():
    x = np.zeros((16, 2), np.float32)
    y = np.zeros(16, np.int64)
    idx = [np.arange(2 * k, 2 * k + 2) for k in range(8)]
    return FederatedDataset(features=x, labels=y, client_indices=idx, num_classes=2)


class CountingAlgorithm(FederatedAlgorithm):
    """A stub with a known event: clients {t % 4, 7} each send a normal draw
    from their own generator; the server adds the mean to the weights."""

    name = "stub"
    Params = _StubParams

    def __init__(self, event, per_client=False):
        self._event = event
        self.per_client_accounting = per_client
        self.calls = 0
        torch.manual_seed(0)
        super().__init__(
            _StubParams(),
            model=torch.nn.Linear(2, 1),
            dataset=_stub_data(),
            noise_multiplier=0.0 if event is None else 1.0,
        )

    @classmethod
    def round_event(cls, params, stats, noise_multiplier, round_index=0):
        raise AssertionError("the stub's event is its own")

    def event(self, round_index=0):
        return self._event

    def select(self, round_index, server):
        self.calls += 1
        clients = np.array([round_index % 4, 7])
        return Cohort(clients, [Task(int(k)) for k in clients])

    def client_step(self, weights, task, streams):
        return Message(fill_normal_(torch.empty(weights.shape), streams.generator))

    def server_step(self, cohort, messages, server):
        self.apply_update(messages.total() / len(cohort.tasks))
        return {"value": float(server.rng.random())}


EVENT = ev.PoissonSampled(0.05, ev.Gaussian(1.0))


def test_budget_guard_stops_before_the_round_and_changes_nothing(tmp_path):
    # The guard allows exactly the rounds the Accountant certifies within
    # (ε, δ) = (2, 1e-5); the next step raises before run_round is called and
    # leaves model, ledger (in memory and on disk) and round counter as they were.
    ledger = PrivacyLedger(Budget(2.0, 1e-5), path=tmp_path / "ledger.json")
    alg = CountingAlgorithm(EVENT)
    trainer = Trainer(alg, ledger=ledger, seed=3)
    allowed = ledger.max_rounds(EVENT)
    assert 1 <= allowed < 200
    trainer.run(allowed)
    assert Accountant().compose(EVENT, allowed).epsilon(1e-5).upper <= 2.0
    assert Accountant().compose(EVENT, allowed + 1).epsilon(1e-5).upper > 2.0
    before = (alg.weights.clone(), alg.calls, ledger.to_json(), trainer.round)
    on_disk = (tmp_path / "ledger.json").read_text()
    with pytest.raises(BudgetExceededError, match="would exceed the budget"):
        trainer.step()
    assert torch.equal(alg.weights, before[0]) and alg.calls == before[1]
    assert ledger.to_json() == before[2] and trainer.round == before[3]
    assert (tmp_path / "ledger.json").read_text() == on_disk


def test_trainer_records_participants_only_for_per_client_schemes():
    for per_client, expected in ((False, None), (True, (1, 7))):
        ledger = PrivacyLedger()
        trainer = Trainer(CountingAlgorithm(EVENT, per_client), ledger=ledger, seed=0)
        trainer.step()
        report = trainer.step()
        assert isinstance(report, RoundReport)
        assert report.round == 1 and trainer.round == 2
        assert report.event == EVENT and report.metrics["value"] >= 0
        assert ledger.entries[1].participants == expected
        assert [e.round for e in ledger.entries] == [0, 1]


@pytest.mark.parametrize("noise", [{"noise_key": KEY}, {"secure_noise": False}])
def test_client_draws_do_not_depend_on_the_executor_or_cohort_order(noise):
    # the same key (secure) or the same seed (reproducible): the same run
    a, b = CountingAlgorithm(EVENT), CountingAlgorithm(EVENT)
    Trainer(a, ledger=PrivacyLedger(), seed=1, execution="loop", **noise).run(3)
    Trainer(b, ledger=PrivacyLedger(), seed=1, execution="batched", **noise).run(3)
    assert torch.equal(a.weights, b.weights)


def test_non_private_rounds_are_not_charged():
    ledger = PrivacyLedger()  # a non-private run: no budget
    trainer = Trainer(CountingAlgorithm(None), ledger=ledger, seed=0)
    reports = trainer.run(3)
    assert ledger.rounds == 0 and [r.event for r in reports] == [None] * 3


def test_rounds_without_noise_are_refused_under_a_finite_budget():
    # A round that adds no noise is neither checked nor chargeable: under a
    # finite budget it would release without any guarantee, so it is refused.
    with pytest.raises(InvalidParameterError, match="ledger.budget must be None"):
        Trainer(CountingAlgorithm(None), ledger=PrivacyLedger(Budget(4, 1e-5)), seed=0)
    trainer = Trainer(
        CountingAlgorithm(EVENT), ledger=PrivacyLedger(Budget(4, 1e-5)), seed=0
    )
    trainer.algorithm = CountingAlgorithm(None)  # swapped after construction
    with pytest.raises(DpflError, match="round 1 would add no noise"):
        trainer.step()
    assert trainer.ledger.rounds == 0 and trainer.round == 0


def test_trainer_resume_is_exact_and_guards_the_ledger(tmp_path):
    # a resumed run is given the run's key (dpfl train keeps it in secret.key)
    full = CountingAlgorithm(EVENT)
    Trainer(full, ledger=PrivacyLedger(), seed=5, noise_key=KEY).run(6)

    first_ledger = PrivacyLedger(path=tmp_path / "l.json")
    first = Trainer(
        CountingAlgorithm(EVENT), ledger=first_ledger, seed=5, noise_key=KEY
    )
    first.run(2)
    torch.save(first.state_dict(), tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt")

    resumed_alg = CountingAlgorithm(EVENT)
    with pytest.raises(InvalidParameterError, match="seed"):
        Trainer(
            resumed_alg, ledger=PrivacyLedger.load(tmp_path / "l.json"), seed=6
        ).load_state_dict(state)
    with pytest.raises(DpflError, match="ledger holds 0 charged rounds"):
        Trainer(resumed_alg, ledger=PrivacyLedger(), seed=5).load_state_dict(state)
    resumed = Trainer(
        resumed_alg,
        ledger=PrivacyLedger.load(tmp_path / "l.json"),
        seed=5,
        noise_key=KEY,
    )
    resumed.load_state_dict(state)
    resumed.run(4)
    assert torch.equal(resumed_alg.weights, full.weights)
    assert resumed.ledger.rounds == 6


def test_concat_joins_shares_in_order_and_keeps_client_state_when_summed():
    from dpfl.sim.algorithms.base import Messages

    a = Messages(
        torch.ones(1, 3),
        {"n": torch.tensor([2.0])},
        summed=True,
        states={"s": torch.tensor([[1.0], [2.0]])},
    )
    b = Messages(
        torch.full((1, 3), 2.0),
        {"n": torch.tensor([1.0])},
        summed=True,
        states={"s": torch.tensor([[3.0]])},
    )
    joined = Messages.concat([a, b])
    assert joined.summed
    assert torch.equal(joined.vectors, torch.full((1, 3), 3.0))
    assert joined.scalar_total("n") == 3.0
    assert torch.equal(joined.states["s"], torch.tensor([[1.0], [2.0], [3.0]]))
    rows = Messages.concat(
        [
            Messages(torch.zeros(2, 3), states={"s": torch.zeros(2)}),
            Messages(torch.ones(1, 3), states={"s": torch.ones(1)}),
        ]
    )
    assert rows.vectors.shape == (3, 3) and torch.equal(
        rows.states["s"], torch.tensor([0.0, 0.0, 1.0])
    )
