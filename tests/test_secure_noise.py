"""Secure noise: the sampler, keyed streams, the key file, and de-noising.

The de-noising test is the attack of issue 16: with a run's ``config.yaml``
and dpfl's own code, regenerate the noise that seeded generators would have
drawn in round 0 and subtract it from the released model. In reproducible
mode this recovers the true gradient sum (the control); in secure mode it
must not.
"""

from __future__ import annotations

import hashlib
import math
import pickle
import struct

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from scipy import stats  # noqa: E402

from dpfl.accounting.ledger import PrivacyLedger  # noqa: E402
from dpfl.errors import DpflError, InvalidParameterError  # noqa: E402
from dpfl.sim import secure_noise as sn  # noqa: E402
from dpfl.sim.randomness import (  # noqa: E402
    CohortStreams,
    Streams,
    client_key,
    client_streams,
    server_streams,
)
from tiny_runs import run_key, tiny_config  # noqa: E402

Z = 4.42  # two-sided normal quantile for a false-alarm rate of 1e-5
KEY = bytes(range(32))


def normals(generator, n, std=1.0):
    return sn.fill_normal_(torch.empty(n, dtype=torch.float64), generator, std)


# ---------------------------------------------------------------- the sampler
def reference_normals(stream_key: bytes, draw: int, n: int) -> list[float]:
    """An independent, scalar re-implementation of the documented sampler.

    SHAKE-256 over (domain, key, draw, chunk 0); 64-bit little-endian words;
    the first half give u1 = (w>>11 + 1)/2^53, the second u2 = (w>>11)/2^53;
    Box–Muller; four normals per output (rows of n), summed and halved.
    """
    tag = b"dpfl/secure-normal/v1" + stream_key + struct.pack("<QQ", draw, 0)
    raw = hashlib.shake_256(tag).digest(8 * 4 * n)
    words = struct.unpack(f"<{4 * n}Q", raw)
    half = 2 * n
    z = []
    for i in range(half):
        u1 = ((words[i] >> 11) + 1) / 2.0**53
        u2 = (words[half + i] >> 11) / 2.0**53
        z.append(math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2))
    for i in range(half):
        u1 = ((words[i] >> 11) + 1) / 2.0**53
        u2 = (words[half + i] >> 11) / 2.0**53
        z.append(math.sqrt(-2.0 * math.log(u1)) * math.sin(2.0 * math.pi * u2))
    return [sum(z[r * n + j] for r in range(4)) / 2.0 for j in range(n)]


def test_sampler_matches_an_independent_scalar_implementation():
    # The vectorised sampler is the documented construction, value for value
    # (tolerance: a few float64 ulps from summation order and libm vs numpy).
    g = sn.SecureGenerator(KEY)
    got = normals(g, 257).numpy()
    want = reference_normals(sn.derive_key(KEY, "noise"), 0, 257)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)
    assert sn.GUARD_SAMPLES == 4  # the Opacus secure_mode guard: 4 normals, /2


def test_secure_normals_are_standard_normal():
    # n = 400,000 draws of N(0, 1): the mean is within Z/sqrt(n); the sample
    # variance within Z*sqrt(2/n) of 1 (its standard error for normal data);
    # the kurtosis within Z*sqrt(24/n) of 3; the KS test against N(0, 1) does
    # not reject at 1e-5. Each check fails a correct sampler with prob ~1e-5.
    n = 400_000
    z = normals(sn.SecureGenerator(KEY), n).numpy()
    assert abs(z.mean()) < Z / math.sqrt(n)
    assert abs(z.var() - 1.0) < Z * math.sqrt(2.0 / n)
    assert abs(stats.kurtosis(z, fisher=False) - 3.0) < Z * math.sqrt(24.0 / n)
    assert stats.kstest(z, "norm").pvalue > 1e-5
    # std scaling and float32 targets
    y = sn.fill_normal_(torch.empty(n), sn.SecureGenerator(KEY), std=3.0)
    assert y.dtype == torch.float32
    assert abs(float(y.double().std()) - 3.0) < 3.0 * Z * math.sqrt(0.5 / n)


def test_a_draw_is_a_function_of_key_and_index_only():
    a, b = sn.SecureGenerator(KEY), sn.SecureGenerator(KEY)
    first, second = normals(a, 1000), normals(a, 1000)
    assert torch.equal(first, normals(b, 1000))  # same key, same draw index
    assert not torch.equal(first, second)  # the next draw is another
    assert a.draws == 2
    # whole chunks of 8,192 outputs do not depend on the draw's length
    long = sn.secure_standard_normal(KEY, 5, 140_000)
    short = sn.secure_standard_normal(KEY, 5, 131_073)
    assert np.array_equal(long[:131_072], short[:131_072])
    assert not np.array_equal(long[131_072:131_073], short[131_072:])
    # the draw index reserved for a later (background) draw is honoured
    c = sn.SecureGenerator(KEY)
    index = c.reserve()
    out = c.normal_(torch.empty(1000, dtype=torch.float64), draw=index)
    assert torch.equal(out, first)


def test_non_contiguous_targets_and_bad_keys():
    g = sn.SecureGenerator(KEY)
    t = torch.zeros(20, 30, dtype=torch.float64).t()  # non-contiguous
    sn.fill_normal_(t, g)
    want = normals(sn.SecureGenerator(KEY), 600).view(30, 20)
    assert torch.equal(t, want)
    with pytest.raises(InvalidParameterError, match="key must be 32 bytes"):
        sn.SecureGenerator(b"short")


# ----------------------------------------------------------- keyed streams
def test_streams_are_independent_across_rounds_and_clients():
    # Streams of distinct (round, client) keys are uncorrelated: each pair's
    # sample correlation over n draws within Z/sqrt(n).
    n = 50_000
    keys = [(t, k) for t in (0, 1, 7) for k in (0, 1, 12)]
    draws = {tk: normals(client_streams(0, *tk, key=KEY).generator, n) for tk in keys}
    server = normals(server_streams(0, 0, key=KEY).generator, n)
    rows = [*draws.values(), server]
    corr = np.corrcoef(torch.stack(rows).numpy())
    off = corr[~np.eye(len(rows), dtype=bool)]
    assert np.abs(off).max() < Z / math.sqrt(n)
    # index draws too: distinct parties' participants differ
    a = client_streams(0, 1, 3, key=KEY).rng.random(8)
    b = client_streams(0, 1, 4, key=KEY).rng.random(8)
    assert not np.array_equal(a, b)


def test_a_client_key_reproduces_its_own_noise_and_no_one_elses():
    mine = client_key(KEY, 4, 2)
    ours = normals(Streams.from_key(mine).generator, 500)
    assert torch.equal(ours, normals(client_streams(0, 4, 2, key=KEY).generator, 500))
    for t, k in ((4, 3), (5, 2), (3, 2), (2, 4)):
        other = normals(client_streams(0, t, k, key=KEY).generator, 500)
        assert float(torch.corrcoef(torch.stack([ours, other]))[0, 1]) < 0.25
        assert not torch.equal(ours, other)
    # what a worker receives holds the clients' derived keys, never the run's key
    cohort = CohortStreams(0, 4, [2, 9, 5], key=KEY)
    for shipped in (pickle.dumps(cohort), pickle.dumps(cohort.part(1, 3))):
        assert KEY not in shipped
        assert sn.derive_key(KEY, "noise") not in shipped
    assert mine in pickle.dumps(cohort)
    back = pickle.loads(pickle.dumps(cohort.part(0, 1)))
    assert back.secure and torch.equal(normals(back[0].generator, 500), ours)
    with pytest.raises(DpflError, match="not shipped"):
        pickle.dumps(Streams.from_key(mine).generator)
    assert "draws=0" in repr(sn.SecureGenerator(KEY)) and KEY.hex() not in repr(
        sn.SecureGenerator(KEY)
    )


def test_reproducible_mode_is_unchanged_seeded_generators():
    # secure_noise=False keeps the seeded SeedSequence/torch generators exactly.
    s = server_streams(3, 2)
    assert isinstance(s.generator, torch.Generator)
    t = torch.empty(10)
    sn.fill_normal_(t, s.generator)
    assert torch.equal(t, torch.randn(10, generator=server_streams(3, 2).generator))
    secure = server_streams(3, 2, key=KEY)
    assert isinstance(secure.generator, sn.SecureGenerator)


# ------------------------------------------------------------- runs and keys
def tiny(tmp_path, name, *, secure, sigma=1.0, rounds=2):
    """The tiny run (tests/tiny_runs.py), seed 0, checkpointed every round."""
    return tiny_config(
        tmp_path,
        name,
        seed=0,
        rounds=rounds,
        eval_every=rounds,
        checkpoint_every=1,
        privacy={"noise_multiplier": sigma, "secure_noise": secure},
    )


def build(config):
    """The algorithm ``dpfl train`` builds for ``config`` (initial weights)."""
    from dpfl.experiments import runner

    dataset = runner._build_dataset(config)
    return runner._build_algorithm(runner._resolve(config, dataset), dataset)


def released(run_dir):
    """The model the run released (its checkpoint), as a flat float64 vector."""
    import yaml

    from dpfl.experiments import config_from_dict

    config = config_from_dict(yaml.safe_load((run_dir / "config.yaml").read_text()))
    state = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    alg = build(config)
    alg.load_state_dict(state["trainer"]["algorithm"])
    return alg.weights.detach().double()


def test_trainer_key_argument_and_modes(tmp_path):
    from dpfl.sim.loop import Trainer

    config = tiny(tmp_path, "t", secure=True)

    def weights_after(**kw):
        trainer = Trainer(build(config), ledger=PrivacyLedger(None), seed=0, **kw)
        trainer.step()
        return trainer, trainer.algorithm.weights.clone()

    a, wa = weights_after(noise_key=KEY)
    _, wb = weights_after(noise_key=KEY)
    assert torch.equal(wa, wb)  # the same key: the same run
    c, wc = weights_after()  # a fresh key each time
    _, wd = weights_after()
    assert (
        c.noise_key is not None and len(c.noise_key) == 32 and not torch.equal(wc, wd)
    )
    assert "noise_key" not in a.state_dict() and KEY not in pickle.dumps(a.state_dict())
    r, wr = weights_after(secure_noise=False)
    assert r.noise_key is None
    assert torch.equal(wr, weights_after(secure_noise=False)[1])  # seeded
    with pytest.raises(InvalidParameterError, match="noise_key"):
        weights_after(secure_noise=False, noise_key=KEY)
    with pytest.raises(InvalidParameterError, match="noise_key must be 32 bytes"):
        weights_after(noise_key=b"123")


def test_key_file_is_private_written_once_and_never_in_config_or_checkpoint(
    tmp_path,
):
    from dpfl.experiments import resume, run

    config = tiny(tmp_path, "secure", secure=True)
    result = run(config, progress=False)
    path = result.run_dir / sn.KEY_FILE
    assert path.stat().st_mode & 0o777 == 0o600
    key = sn.read_key_file(path)
    for name in ("config.yaml", "checkpoint.pt", "ledger.json", "guarantee.json"):
        data = (result.run_dir / name).read_bytes()
        assert key not in data and key.hex().encode() not in data, name
    assert not [p for p in result.run_dir.iterdir() if p.name.startswith(".secret")]
    with pytest.raises(DpflError, match="never replaced"):
        sn.write_key_file(path, sn.new_key())
    assert sn.read_key_file(path) == key
    # a secure run without its key cannot be resumed
    path.unlink()
    with pytest.raises(DpflError, match="cannot be resumed without its key"):
        resume(result.run_dir, progress=False)
    path.write_text("not a key\n")
    with pytest.raises(DpflError, match=r"mode 0644.*chmod 600"):
        resume(result.run_dir, progress=False)  # others may read it
    path.chmod(0o600)
    with pytest.raises(DpflError, match="32-byte hex key"):
        resume(result.run_dir, progress=False)


def test_the_report_says_which_noise_was_used(tmp_path):
    import json

    from dpfl.experiments import run
    from dpfl.experiments.cli import _summary

    for secure, label in ((True, "secure"), (False, "reproducible (seeded")):
        result = run(tiny(tmp_path, f"r{secure}", secure=secure), progress=False)
        g = json.loads((result.run_dir / "guarantee.json").read_text())
        assert g["noise"].startswith(label)
        assert result.guarantee["noise"] == g["noise"]
        assert f"  noise: {label}" in _summary(result)  # dpfl train's report
        assert (result.run_dir / sn.KEY_FILE).exists() == secure


def test_a_resumed_secure_run_draws_what_the_uninterrupted_run_drew(
    tmp_path, monkeypatch
):
    # The key file makes the noise replayable by its holder: a 3-round run
    # equals the same run (same folder key) stopped by Ctrl-C after round 2
    # and resumed; the other way round, a different key gives another model.
    import os
    import signal

    from dpfl.experiments import resume, run
    from dpfl.sim.loop import Trainer

    whole = run(tiny(tmp_path, "whole", secure=True, rounds=3), progress=False)
    config = tiny(tmp_path, "cut", secure=True, rounds=3)
    original = Trainer.step

    def step(self):
        report = original(self)
        if self.round == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return report

    with monkeypatch.context() as m, run_key(whole.run_dir):
        m.setattr(Trainer, "step", step)
        assert run(config, progress=False).stopped == "interrupted"
    assert resume(config.run_dir, progress=False).rounds_completed == 3
    assert torch.equal(released(config.run_dir), released(whole.run_dir))
    other = run(tiny(tmp_path, "other", secure=True, rounds=3), progress=False)
    assert not torch.equal(released(other.run_dir), released(whole.run_dir))


def test_a_released_round_cannot_be_denoised_from_the_config_and_code(
    tmp_path, monkeypatch
):
    """The attack of issue 16, against a real run with σ = 20.

    Adversary: has ``config.yaml``, dpfl's code and the released model after
    round 0; regenerates what the seeded server generator draws in round 0
    (the noise of DP-DSGD's gradient estimate), subtracts it and reads off
    the clipped gradient sum. Truth: the same round run with the noise
    switched off (same participants: same seed, or the same key file).
    Reproducible mode (control): recovered to ~1e-6 (float32 rounding);
    asserted below 1e-3. Secure mode: the relative error is ~σ·sqrt(d)·C /
    ‖sum‖ ≫ 1; asserted above 1.
    """
    import yaml

    from dpfl.experiments import config_from_dict, run
    from dpfl.sim.privatize import CentralGaussian

    def attack(run_dir):
        config = config_from_dict(yaml.safe_load((run_dir / "config.yaml").read_text()))
        alg = build(config)  # public: the seeded initial weights, σ, C, p, q, n
        w0 = alg.weights.detach().clone().double()
        gen = server_streams(config.seed, 0).generator  # seeded: from the config
        noise = torch.zeros_like(alg.weights)
        alg.privatizer.start_noise(
            {"w": alg.weights},
            num_participants=0,
            num_available=alg.stats.num_clients,
            generator=gen,
            scale=alg.scale,
            background=False,
        ).add_to_({"w": noise})
        estimate = (w0 - released(run_dir)) / config.algorithm.params.learning_rate
        return (estimate - noise.double()) / alg.scale

    def truth(name, secure, key_from=None):
        with monkeypatch.context() as m:
            m.setattr(CentralGaussian, "noise_std", lambda self, **kw: 0.0)
            config = tiny(tmp_path, name, secure=secure, sigma=20.0, rounds=1)
            if key_from is not None:
                m.setattr(
                    sn, "new_key", lambda: sn.read_key_file(key_from / sn.KEY_FILE)
                )
            run_dir = run(config, progress=False).run_dir
        w0 = build(config).weights.detach().double()
        estimate = (w0 - released(run_dir)) / config.algorithm.params.learning_rate
        return estimate / build(config).scale

    errors = {}
    for secure in (False, True):
        name = "secure" if secure else "seeded"
        run_dir = run(
            tiny(tmp_path, name, secure=secure, sigma=20.0, rounds=1), progress=False
        ).run_dir
        true = truth(name + "-truth", secure, run_dir if secure else None)
        assert float(true.norm()) > 0
        errors[secure] = float((attack(run_dir) - true).norm() / true.norm())
    print("relative errors of the recovered sum (secure: error):", errors)
    assert errors[False] < 1e-3, errors  # the control: de-noised
    assert errors[True] > 1.0, errors  # secure: nothing recovered
