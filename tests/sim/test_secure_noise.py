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
from dpfl.sim import (  # noqa: E402
    chacha,
    keys,
)
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


# ------------------------------------------------------------- the keystream
# RFC 8439 test vectors (Nir & Langley, "ChaCha20 and Poly1305 for IETF
# Protocols", 2018): key 00..1f throughout except A.1.
RFC_KEY = bytes(range(32))
# §2.3.2: the block function, nonce 00:00:00:09:00:00:00:4a:00:00:00:00, counter 1
RFC_BLOCK = bytes.fromhex(
    "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
    "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
)
# Appendix A.1, test vector #1: zero key, zero nonce, counter 0
RFC_ZERO_BLOCK = bytes.fromhex(
    "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
    "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586"
)
# §2.4.2: encryption, nonce 00:00:00:00:00:00:00:4a:00:00:00:00, counter 1
RFC_PLAINTEXT = (
    b"Ladies and Gentlemen of the class of '99: If I could offer you only one "
    b"tip for the future, sunscreen would be it."
)
RFC_CIPHERTEXT = bytes.fromhex(
    "6e2e359a2568f98041ba0728dd0d6981e97e7aec1d4360c20a27afccfd9fae0b"
    "f91b65c5524733ab8f593dabcd62b3571639d624e65152ab8f530c359f0861d8"
    "07ca0dbf500d6a6156a38e088a22b65e52bc514d16ccf806818ce91ab7793736"
    "5af90bbf74a35be6b40b8eedf2785e42874d"
)


def python_block(key: bytes, nonce: bytes, counter: int) -> bytes:
    """RFC 8439's block function (§2.3), scalar Python: an independent reference."""

    def rotl(v, r):
        return ((v << r) & 0xFFFFFFFF) | (v >> (32 - r))

    def quarter(x, a, b, c, d):
        x[a] = (x[a] + x[b]) & 0xFFFFFFFF
        x[d] = rotl(x[d] ^ x[a], 16)
        x[c] = (x[c] + x[d]) & 0xFFFFFFFF
        x[b] = rotl(x[b] ^ x[c], 12)
        x[a] = (x[a] + x[b]) & 0xFFFFFFFF
        x[d] = rotl(x[d] ^ x[a], 8)
        x[c] = (x[c] + x[d]) & 0xFFFFFFFF
        x[b] = rotl(x[b] ^ x[c], 7)

    state = [0x61707865, 0x3320646E, 0x79622D32, 0x6B206574]
    state += list(struct.unpack("<8I", key)) + [counter]
    state += list(struct.unpack("<3I", nonce))
    x = list(state)
    for _ in range(10):
        quarter(x, 0, 4, 8, 12)
        quarter(x, 1, 5, 9, 13)
        quarter(x, 2, 6, 10, 14)
        quarter(x, 3, 7, 11, 15)
        quarter(x, 0, 5, 10, 15)
        quarter(x, 1, 6, 11, 12)
        quarter(x, 2, 7, 8, 13)
        quarter(x, 3, 4, 9, 14)
    return struct.pack("<16I", *((a + b) & 0xFFFFFFFF for a, b in zip(x, state)))


def openssl_keystream(key: bytes, nonce: bytes, counter: int, nbytes: int) -> bytes:
    crypto = pytest.importorskip("cryptography.hazmat.primitives.ciphers")
    cipher = crypto.Cipher(
        crypto.algorithms.ChaCha20(key, counter.to_bytes(4, "little") + nonce),
        mode=None,
    )
    return cipher.encryptor().update(bytes(nbytes))


def test_rfc8439_vectors():
    # The Python reference, dpfl's torch rounds and OpenSSL all give the RFC's
    # bytes exactly.
    nonce = bytes.fromhex("000000090000004a00000000")
    assert python_block(RFC_KEY, nonce, 1) == RFC_BLOCK
    assert chacha.chacha20_keystream(RFC_KEY, nonce, 1, 1) == RFC_BLOCK
    assert python_block(bytes(32), bytes(12), 0) == RFC_ZERO_BLOCK
    assert chacha.chacha20_keystream(bytes(32), bytes(12), 0, 1) == RFC_ZERO_BLOCK
    nonce = bytes.fromhex("000000000000004a00000000")
    stream = chacha.chacha20_keystream(RFC_KEY, nonce, 1, 2)
    ct = bytes(p ^ k for p, k in zip(RFC_PLAINTEXT, stream))
    assert ct == RFC_CIPHERTEXT
    assert openssl_keystream(RFC_KEY, nonce, 1, 128) == stream


def test_torch_keystream_equals_openssl_byte_for_byte():
    # Random keys, nonces and counters, up to the last block before the
    # 32-bit counter wraps; several hundred blocks (many ChaCha20 states).
    rng = np.random.default_rng(5)
    for counter, nblocks in ((0, 600), (7, 1), (2**31 - 3, 9), (2**32 - 40, 40)):
        key = rng.bytes(32)
        nonce = rng.bytes(12)
        mine = chacha.chacha20_keystream(key, nonce, counter, nblocks)
        assert mine == openssl_keystream(key, nonce, counter, 64 * nblocks)
        assert mine[:64] == python_block(key, nonce, counter)
    with pytest.raises(InvalidParameterError, match="counter"):
        chacha.chacha20_keystream(KEY, bytes(12), 2**32 - 1, 2)


# ---------------------------------------------------------------- the sampler
def reference_v2(stream_key: bytes, draw: int, index: int) -> float:
    """Output ``index`` of draw ``draw``, as documented, in scalar Python.

    Group g = index // 1024 is keystream bytes [32768 g, 32768 (g + 1)) under
    nonce (draw, 0), four rows of 1024 little-endian 64-bit words; output
    i = index % 1024 takes column i: s = word >> 11 (signed); rows 0 and 1
    give u = (s + 2^52 + 1) / 2^53, rows 2 and 3 the angles s * pi / 2^52;
    the output is (r0 (cos + sin)(t0) + r1 (cos + sin)(t1)) / 2.
    """
    nonce = draw.to_bytes(8, "little") + bytes(4)
    g, i = divmod(index, 1024)
    s = []
    for row in range(4):
        word = 4096 * g + 1024 * row + i  # 64-bit word of the draw's keystream
        block = python_block(stream_key, nonce, word // 8)
        (w,) = struct.unpack_from("<q", block, 8 * (word % 8))
        s.append(w >> 11)
    total = 0.0
    for p in range(2):
        u = (s[p] + 2**52 + 1) / 2.0**53
        theta = s[2 + p] * (math.pi / 2.0**52)
        r = math.sqrt(-2.0 * math.log(u))
        total += r * (math.cos(theta) + math.sin(theta))
    return total / 2.0


def test_sampler_matches_an_independent_scalar_implementation():
    # Outputs in the first group, across a group boundary and deep in a draw
    # are the documented construction, value for value (tolerance: a few
    # float64 ulps between libm and torch's vectorised functions).
    stream_key = keys.derive_key(KEY, "noise")
    g = sn.SecureGenerator(KEY)
    assert g.version == sn.STREAM_VERSION == "chacha20-v3"
    first = normals(g, 20_000).numpy()
    second = normals(g, 3000).numpy()  # draw 1
    for i in (0, 1, 2, 1023, 1024, 1025, 8191, 8192, 19_999):
        assert first[i] == pytest.approx(reference_v2(stream_key, 0, i), abs=1e-13)
    for i in (0, 2047, 2999):
        assert second[i] == pytest.approx(reference_v2(stream_key, 1, i), abs=1e-13)
    assert sn.GUARD_SAMPLES == 4  # the Opacus secure_mode guard: 4 normals, /2


def reference_v1(stream_key: bytes, draw: int, n: int) -> list[float]:
    """The shake256-v1 sampler in scalar Python (chunk 0 of a draw).

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


def test_the_shake256_v1_stream_is_still_drawn_as_before():
    # A run started under shake256-v1 resumes with the same stream: the
    # previous sampler, value for value (a few float64 ulps, libm vs numpy).
    g = sn.SecureGenerator(KEY, version="shake256-v1")
    got = normals(g, 257).numpy()
    want = reference_v1(keys.derive_key(KEY, "noise"), 0, 257)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)
    v1 = sn.secure_standard_normal(KEY, 3, 100, version="shake256-v1")
    assert not np.array_equal(v1, sn.secure_standard_normal(KEY, 3, 100))
    with pytest.raises(InvalidParameterError, match="version must be one of"):
        sn.SecureGenerator(KEY, version="chacha20-v9")


def test_openssl_and_torch_keystreams_give_the_same_normals():
    # On the CPU both paths run the same float64 transform on the same bits:
    # equal bit for bit, for lengths around the piece and group sizes.
    pytest.importorskip("cryptography")
    stream_key = keys.derive_key(KEY, "noise")
    for n in (1, 1023, 1025, 8192, 8193, 20_000):
        a = torch.empty(n, dtype=torch.float64)
        b = torch.empty(n, dtype=torch.float64)
        sn._fill_chacha20(stream_key, 2**40 + n, a, 1.5, openssl=True)
        sn._fill_chacha20(stream_key, 2**40 + n, b, 1.5, openssl=False)
        assert torch.equal(a, b), n


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


@pytest.mark.slow  # 1e7 draws, a sort and a histogram: ~10 s
def test_ten_million_secure_normals_pass_ks_chi_square_and_tail_tests():
    # KS against N(0, 1); chi-square of Phi(z) in 1,000 equiprobable bins
    # (999 degrees of freedom); the counts beyond |z| > 4 and > 5 against
    # their binomial expectation (within Z standard deviations, or 5 counts
    # for the rare tail). Each fails a correct sampler with prob ~1e-5.
    n = 10_000_000
    z = normals(sn.SecureGenerator(keys.new_key()), n).numpy()
    assert stats.kstest(z, "norm").pvalue > 1e-5
    counts = np.bincount(
        np.minimum((stats.norm.cdf(z) * 1000).astype(np.int64), 999), minlength=1000
    )
    assert stats.chisquare(counts).pvalue > 1e-5
    for t in (4.0, 5.0):
        p = 2 * stats.norm.sf(t)
        want, sd = n * p, math.sqrt(n * p * (1 - p))
        assert abs(int((np.abs(z) > t).sum()) - want) < max(Z * sd, 5), t
    assert abs(z.mean()) < Z / math.sqrt(n)
    assert abs(z.var() - 1.0) < Z * math.sqrt(2.0 / n)


def test_no_correlation_across_positions_draws_and_keys():
    # Sample correlations of n pairs within Z/sqrt(n) (false alarm ~1e-5 per
    # check): neighbours, outputs one and several groups (1,024) or pieces
    # (8,192) apart, successive draws of one stream, and streams of distinct
    # keys.
    n = 200_000
    g = sn.SecureGenerator(KEY)
    z = normals(g, n + 8192).numpy()
    for lag in (1, 2, 3, 1023, 1024, 1025, 2048, 4096, 8192):
        r = np.corrcoef(z[:n], z[lag : lag + n])[0, 1]
        assert abs(r) < Z / math.sqrt(n), lag
    rows = [z[:n], normals(g, n).numpy(), normals(g, n).numpy()]
    rows += [normals(sn.SecureGenerator(keys.new_key()), n).numpy() for _ in range(3)]
    corr = np.corrcoef(np.stack(rows))
    assert np.abs(corr[~np.eye(len(rows), dtype=bool)]).max() < Z / math.sqrt(n)


def test_a_draw_is_a_function_of_key_and_index_only():
    a, b = sn.SecureGenerator(KEY), sn.SecureGenerator(KEY)
    first, second = normals(a, 1000), normals(a, 1000)
    assert torch.equal(first, normals(b, 1000))  # same key, same draw index
    assert not torch.equal(first, second)  # the next draw is another
    assert a.draws == 2
    # output i does not depend on the draw's length (a longer draw extends
    # a shorter one), and pieces of any size give the same values
    long = sn.secure_standard_normal(KEY, 5, 140_000)
    for n in (1, 1023, 1025, 8191, 8193, 131_073):
        assert np.array_equal(long[:n], sn.secure_standard_normal(KEY, 5, n)), n
    # the draw index reserved for a later (background) draw is honoured
    c = sn.SecureGenerator(KEY)
    index = c.reserve()
    out = c.normal_(torch.empty(1000, dtype=torch.float64), draw=index)
    assert torch.equal(out, first)
    # float32 targets are the float64 values, rounded once
    f32 = sn.SecureGenerator(KEY).normal_(torch.empty(1000), std=0.7)
    assert torch.equal(f32, (first * 0.7).float())
    with pytest.raises(InvalidParameterError, match="draw must be"):
        sn.secure_standard_normal(KEY, -1, 3)


def test_non_contiguous_targets_and_bad_keys():
    for version in sn.STREAM_VERSIONS:
        g = sn.SecureGenerator(KEY, version=version)
        t = torch.zeros(20, 30, dtype=torch.float64).t()  # non-contiguous
        sn.fill_normal_(t, g)
        want = normals(sn.SecureGenerator(KEY, version=version), 600).view(30, 20)
        assert torch.equal(t, want)
    with pytest.raises(InvalidParameterError, match="key must be 32 bytes"):
        sn.SecureGenerator(b"short")


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@CUDA
def test_cuda_draws_the_cpu_stream():
    # The keystream is the same bits on CUDA (compiled or eager) as on the
    # CPU; the float64 normals differ by at most a few ulps (CUDA's and the
    # CPU's log/sin/cos each round within ~1 ulp): asserted within 1e-13
    # absolute, and float32 targets equal but for rare last-bit ties
    # (asserted: at most 1 in 10,000 differs, by one float32 ulp).
    nonce = bytes(range(12))
    for counter, nblocks in ((0, 1500), (2**32 - 600, 600)):
        assert chacha.chacha20_keystream(
            KEY, nonce, counter, nblocks, device="cuda"
        ) == chacha.chacha20_keystream(KEY, nonce, counter, nblocks)
    n = 3_000_000
    cpu = sn.SecureGenerator(KEY).normal_(torch.empty(n, dtype=torch.float64))
    gen = sn.SecureGenerator(KEY, "cuda")
    gpu = gen.normal_(torch.empty(n, dtype=torch.float64, device="cuda")).cpu()
    assert float((gpu - cpu).abs().max()) < 1e-13
    c32 = sn.SecureGenerator(KEY).normal_(torch.empty(n))
    g32 = sn.SecureGenerator(KEY).normal_(torch.empty(n, device="cuda")).cpu()
    differ = c32 != g32
    assert int(differ.sum()) <= n // 10_000
    ulp = torch.finfo(torch.float32).eps * c32[differ].abs().clamp(min=2**-126)
    assert bool(((c32 - g32)[differ].abs() <= ulp).all())
    # the eager kernel (no torch.compile) gives the same keystream
    init = torch.tensor(
        chacha._initial_state(KEY, nonce, 0), dtype=torch.int64, device="cuda"
    )
    kernel = chacha._words_kernel(torch.device("cuda"))
    assert torch.equal(kernel(init, 1024), chacha._words(init, 1024))


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
        assert keys.derive_key(KEY, "noise") not in shipped
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
    from dpfl.experiments import build
    from dpfl.experiments.privacy import resolve_privacy

    dataset = build.build_dataset(config)
    return build.build_algorithm(resolve_privacy(config, dataset), dataset)


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
    path = result.run_dir / keys.KEY_FILE
    assert path.stat().st_mode & 0o777 == 0o600
    key = keys.read_key_file(path)
    for name in ("config.yaml", "checkpoint.pt", "ledger.json", "guarantee.json"):
        data = (result.run_dir / name).read_bytes()
        assert key not in data and key.hex().encode() not in data, name
    assert not [p for p in result.run_dir.iterdir() if p.name.startswith(".secret")]
    with pytest.raises(DpflError, match="never replaced"):
        keys.write_key_file(path, keys.new_key())
    assert keys.read_key_file(path) == key
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

    from dpfl.cli.train import _summary
    from dpfl.experiments import run

    for secure, label in ((True, "secure"), (False, "reproducible (seeded")):
        result = run(tiny(tmp_path, f"r{secure}", secure=secure), progress=False)
        g = json.loads((result.run_dir / "guarantee.json").read_text())
        assert g["noise"].startswith(label)
        assert result.guarantee["noise"] == g["noise"]
        assert f"  noise: {label}" in _summary(result)  # dpfl train's report
        assert (result.run_dir / keys.KEY_FILE).exists() == secure


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
                    keys,
                    "new_key",
                    lambda: keys.read_key_file(key_from / keys.KEY_FILE),
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


def test_a_run_records_its_stream_and_resumes_with_it(tmp_path, monkeypatch):
    # run.json records the stream a run draws from (part of the run's
    # identity). A run started under shake256-v1 resumes with shake256-v1,
    # whatever this dpfl draws for new runs, and draws what it drew
    # uninterrupted; a stream this dpfl lacks is refused in one line.
    import json
    import os
    import signal

    from dpfl.experiments import resume, run
    from dpfl.sim.loop import Trainer

    fresh = run(tiny(tmp_path, "fresh", secure=True, rounds=1), progress=False)
    manifest = json.loads((fresh.run_dir / "run.json").read_text())
    assert manifest["stream_version"] == sn.STREAM_VERSION

    with monkeypatch.context() as m:  # an uninterrupted run of the old stream
        m.setattr(sn, "STREAM_VERSION", "shake256-v1")
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
        m.setattr(sn, "STREAM_VERSION", "shake256-v1")
        assert run(config, progress=False).stopped == "interrupted"
    path = config.run_dir / "run.json"
    assert json.loads(path.read_text())["stream_version"] == "shake256-v1"
    assert sn.STREAM_VERSION != "shake256-v1"  # new runs draw another stream
    assert resume(config.run_dir, progress=False).rounds_completed == 3
    assert torch.equal(released(config.run_dir), released(whole.run_dir))

    monkeypatch.setattr(sn, "STREAM_VERSIONS", (sn.STREAM_VERSION,))
    with pytest.raises(DpflError, match="'shake256-v1', which this dpfl does not"):
        resume(config.run_dir, progress=False)


def test_keyed_orders_are_the_documented_sort_of_shake128_words():
    # Independent construction from the docstring: SHAKE-128 of
    # "dpfl/order" ‖ 0 ‖ key ‖ e, n little-endian 64-bit words, positions
    # sorted by word (ties by position); exact.
    import hashlib
    import struct

    n = 37
    got = keys.keyed_orders(KEY, n, 3)
    for e in range(3):
        raw = hashlib.shake_128(
            b"dpfl/order\x00" + KEY + e.to_bytes(8, "little")
        ).digest(8 * n)
        words = struct.unpack(f"<{n}Q", raw)
        want = sorted(range(n), key=lambda i: (words[i], i))
        assert got[e].tolist() == want
    assert sorted(got[0].tolist()) == list(range(n))
    assert keys.keyed_orders(KEY, 0, 1).shape == (1, 0)


def test_client_orders_by_stream_version():
    # v3 streams draw keyed orders; v2 streams (runs started before v3) still
    # draw theirs from the index generator, so they resume as they ran.
    from dpfl.sim.local import epoch_orders
    from dpfl.sim.randomness import Streams

    v3 = Streams.from_key(KEY, stream_version="chacha20-v3")
    v2 = Streams.from_key(KEY, stream_version="chacha20-v2")
    assert v3.epoch_orders(20, 2).tolist() == keys.keyed_orders(KEY, 20, 2).tolist()
    want = epoch_orders(keys.index_rng(KEY), 20, 2)
    assert v2.epoch_orders(20, 2).tolist() == want.tolist()


def test_reproducible_streams_are_the_documented_spawned_children():
    # Source: the randomness module's docstring (SeedSequence(seed,
    # spawn_key=(t, 2, k)) split into a numpy and a torch generator), built
    # here with numpy's own spawn: the same index and noise draws, exactly.
    from dpfl.sim.randomness import client_streams, server_streams

    for seed, t, k in ((0, 5, 17), (2**40, 99, 10**6)):
        np_seq, torch_seq = np.random.SeedSequence(seed, spawn_key=(t, 2, k)).spawn(2)
        got = client_streams(seed, t, k)
        want = np.random.default_rng(np_seq).integers(0, 2**62, 8)
        assert got.rng.integers(0, 2**62, 8).tolist() == want.tolist()
        g = torch.Generator()
        g.manual_seed(int(torch_seq.generate_state(1, np.uint64)[0]))
        assert torch.equal(
            torch.randn(6, generator=got.generator), torch.randn(6, generator=g)
        )
    np_seq, _ = np.random.SeedSequence(3, spawn_key=(4,)).spawn(2)
    want = np.random.default_rng(np_seq).random(3)
    assert server_streams(3, 4).rng.random(3).tolist() == want.tolist()
