"""The fused Triton kernel of the chacha20-v2 stream (:mod:`dpfl.sim._chacha_triton`).

On CUDA, :mod:`dpfl.sim.secure_noise` draws with it only after a probe shows
it equal to the torch operations bit for bit; these tests check the same
thing more widely:

* on the CPU, under Triton's interpreter (``TRITON_INTERPRET=1``, numpy
  executes the kernel): the block function gives RFC 8439's test vector and
  the torch keystream (counters across 2³¹ and up to 2³²); float32 normals
  equal the torch path's bit for bit; float64 normals equal, bit for bit, the
  torch path's operations done in numpy (the interpreter's logarithm, sine
  and cosine are numpy's, which may differ from torch's CPU ones in the last
  bit; on CUDA both sides use libdevice). Skipped where Triton is not
  installed (it is not a dependency of dpfl);
  The kernel of many rows (one launch for a cohort's rows, each row its own
  key and draw) gives each row what the one-draw kernel gives it;
* on CUDA (``-m gpu``): the fused kernel is what a draw uses, and its
  outputs equal the torch operations' bit for bit for several keys, draws,
  lengths, dtypes and scales; a cohort's rows drawn in one launch equal
  the rows drawn one at a time;
* anywhere, with a stand-in for the kernel module (torch operations): the
  probe, the launchers and the fallbacks of
  :func:`~dpfl.sim.secure_noise.fill_normal_rows_` (a probe that finds a
  wrong bit, a launch that fails: the rows are drawn one at a time, with the
  draws already reserved), and that none of it deadlocks on the kernels'
  lock.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from dpfl.errors import InvalidParameterError
from dpfl.sim import chacha
from dpfl.sim import keys as sk
from dpfl.sim import secure_noise as sn

TRITON = importlib.util.find_spec("triton") is not None
NO_TRITON = "Triton is not installed (pip install triton; not a dpfl dependency)"

INTERPRETED = textwrap.dedent(
    """
    import numpy as np
    import torch

    from dpfl.sim import _chacha_triton as ct
    from dpfl.sim import secure_noise as sn

    # RFC 8439, 2.3.2: the block function's test vector
    key = bytes(range(32))
    nonce = bytes.fromhex("000000090000004a00000000")
    block = ct.keystream_words(chacha._initial_state(key, nonce, 1), 1, "cpu")
    assert block.numpy().astype("<u4").tobytes().hex() == (
        "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
        "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
    )
    for counter, n in ((0, 70), (2**31 - 3, 9), (2**32 - 40, 40)):
        state = chacha._initial_state(key, bytes(range(12)), counter)
        mine = ct.keystream_words(state, n, "cpu").numpy().astype("<u4").tobytes()
        assert mine == chacha.chacha20_keystream(key, bytes(range(12)), counter, n)

    def numpy_normals(state, g0, n, scale, dtype):
        # the torch path's operations, in numpy (the interpreter's math)
        groups = -(-n // chacha.GROUP)
        init = torch.tensor(state, dtype=torch.int64)
        init[12] += g0 * chacha._GROUP_BLOCKS
        blocks = groups * chacha._GROUP_BLOCKS
        s = chacha._words(init, blocks).view(groups, 4, chacha.GROUP)
        s = s.numpy()
        r = np.sqrt(np.log((s[:, :2] + (2**52 + 1)).astype(np.float64) * 2.0**-53)
                    * -2.0)
        t = s[:, 2:].astype(np.float64) * (np.pi * 2.0**-52)
        c = (np.cos(t) + np.sin(t)) * r
        return torch.from_numpy(((c[:, 0] + c[:, 1]).reshape(-1)[:n] * scale)
                                .astype(dtype))

    stream = sk.derive_key(bytes(range(1, 33)), "noise")
    for draw, g0, n, scale in ((0, 0, 1, 0.5), (5, 0, 2 * 1024 + 37, 0.85),
                               (2**40 + 3, 2**22 - 1, 2 * 1024, 0.65),
                               (7, 2**23 - 2, 2 * 1024, 0.5)):
        state = chacha._initial_state(stream, chacha._nonce(draw), 0)
        for dtype, npdtype in ((torch.float32, np.float32),
                               (torch.float64, np.float64)):
            got = torch.full((n,), float("nan"), dtype=dtype)
            ct.fill_normals(got, state, scale, first=g0 * 1024, libdevice=False)
            assert torch.equal(got, numpy_normals(state, g0, n, scale, npdtype)), (
                draw, n, dtype)
            if dtype == torch.float32:
                want = torch.empty(n, dtype=dtype)
                chacha._fill_groups(state, g0, want, scale, chacha._words)
                assert torch.equal(got, want), (draw, n)

    # many rows in one launch: each row the draw of its own state, in rows of
    # a wider tensor (unaligned starts), nothing written outside them
    states = [chacha._initial_state(sk.derive_key(bytes([k]) * 32, "noise"),
                                chacha._nonce(draw), 0)
              for k, draw in ((1, 0), (2, 2**40 + 3), (3, 2**63 + 5))]
    n = 1024 + 13
    for dtype in (torch.float32, torch.float64):
        got = torch.full((3, n + 3), float("nan"), dtype=dtype)
        ct.fill_rows(got[:, :n], states, 0.65, libdevice=False)
        for r, state in enumerate(states):
            one = torch.full((n,), float("nan"), dtype=dtype)
            ct.fill_normals(one, state, 0.65, libdevice=False)
            assert torch.equal(got[r, :n], one), (r, dtype)
        assert bool(got[:, n:].isnan().all())
    print("ok")
    """
)


@pytest.mark.slow  # the interpreter runs the kernel in numpy: ~30 s
@pytest.mark.skipif(not TRITON, reason=NO_TRITON)
def test_the_fused_kernel_under_the_interpreter_is_the_torch_path():
    # In a fresh process: the interpreter is chosen when the kernels are
    # defined (at import), from the environment.
    env = dict(os.environ, TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "-c", INTERPRETED],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@CUDA
@pytest.mark.skipif(not TRITON, reason=NO_TRITON)
def test_the_fused_kernel_draws_the_torch_operations_bits_on_cuda():
    from dpfl.sim import _chacha_triton as ct

    device = torch.device("cuda", torch.cuda.current_device())
    assert sn.noise_kernel(device) == "triton", chacha._FUSED.get(device)
    for counter, n in ((0, 1500), (2**31 - 300, 600), (2**32 - 600, 600)):
        state = chacha._initial_state(bytes(range(32)), bytes(range(12)), counter)
        words = ct.keystream_words(state, n, device).cpu().numpy()
        assert words.astype("<u4").tobytes() == chacha.chacha20_keystream(
            bytes(range(32)), bytes(range(12)), counter, n
        )
    for seed, draw, n, std in (
        (1, 0, 1, 1.0),
        (2, 3, 8, 2.5),
        (3, 2**63 + 5, 1023, 0.1),
        (4, 17, 4096 + 5, 1.0),
        (5, 9, 1_000_003, 3.0),
    ):
        stream = sk.derive_key(bytes([seed]) * 32, "noise")
        for dtype in (torch.float32, torch.float64):
            want = torch.empty(n, dtype=dtype, device=device)
            chacha._fill_torch(stream, draw, want, 0.5 * std, compiled=False)
            got = torch.full((n,), float("nan"), dtype=dtype, device=device)
            sn._fill_chacha20(stream, draw, got, std)  # the fused kernel
            assert torch.equal(got, want), (seed, draw, n, dtype)
    # a cohort's rows in one launch (PriFedSync's step): each row its
    # generator's next draw, as drawn alone
    assert chacha._fused_rows(device) is not None, chacha._FUSED.get(device)
    for rows, n in ((2, 1), (5, 4099), (60, 200_003)):
        keys = [bytes([k]) * 32 for k in range(rows)]
        for dtype in (torch.float32, torch.float64):
            alone = [sn.SecureGenerator(k, device) for k in keys]
            together = [sn.SecureGenerator(k, device) for k in keys]
            for g in (alone[1], together[1]):
                g.reserve()
            want = torch.empty(rows, n, dtype=dtype, device=device)
            for row, g in zip(want, alone):
                sn.fill_normal_(row, g, 1.5)
            got = torch.full((rows, n), float("nan"), dtype=dtype, device=device)
            sn.fill_normal_rows_(got, together, 1.5)
            assert torch.equal(got, want), (rows, n, dtype)
            assert [g.draws for g in together] == [g.draws for g in alone]


# -- the launchers, probe and fallbacks, with a stand-in kernel (no Triton) ----
class _StandIn:
    """A kernel module that computes with the torch operations.

    ``wrong_rows``: the many-rows kernel flips one bit; ``failing_rows``: it
    raises.
    """

    def __init__(self, wrong_rows=False, failing_rows=False):
        self.wrong_rows, self.failing_rows = wrong_rows, failing_rows
        self.launches = 0

    def fill_normals(self, out, state, scale, *, first=0, libdevice=True):
        chacha._fill_groups(state, first // chacha.GROUP, out, scale, chacha._words)
        return out

    def fill_rows(self, out, states, scale, *, libdevice=True):
        self.launches += 1
        if self.failing_rows:
            raise RuntimeError("launch failed")
        for row, state in zip(out, states, strict=True):
            chacha._fill_groups(state, 0, row, scale, chacha._words)
        if self.wrong_rows:
            out.view(torch.int32 if out.dtype == torch.float32 else torch.int64)[
                -1, 0
            ] ^= 1
        return out


@pytest.fixture
def stand_in(monkeypatch):
    """The fused path tried on the CPU, with :class:`_StandIn` as its kernel."""

    def use(**kwargs):
        kernel = _StandIn(**kwargs)
        monkeypatch.setitem(sys.modules, "dpfl.sim._chacha_triton", kernel)
        monkeypatch.setattr(chacha, "_FUSED_DEVICE_TYPES", ("cuda", "cpu"))
        monkeypatch.setattr(chacha, "_FUSED", {})
        monkeypatch.delenv("DPFL_NOISE_TRITON", raising=False)
        return kernel

    return use


def _rows_in_turn(keys, n, std, dtype=torch.float32, skip=()):
    """Each key's row as ``fill_normal_`` draws it, one generator at a time."""
    gens = [sn.SecureGenerator(k, "cpu") for k in keys]
    for g, s in zip(gens, skip or [0] * len(gens)):
        for _ in range(s):
            g.reserve()
    out = torch.empty(len(keys), n, dtype=dtype)
    for row, g in zip(out, gens):
        sn.fill_normal_(row, g, std)
    return out, gens


def _in_thread(fn):
    """``fn()`` on a thread, failing (not hanging) if it deadlocks."""
    import threading

    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", fn()), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "deadlock: the call did not return in 60 s"
    return box["r"]


def test_a_cohort_of_rows_is_one_launch_and_each_row_its_generators_draw(stand_in):
    kernel = stand_in()
    keys = [bytes([k]) * 32 for k in (1, 2, 3, 4)]
    want, _ = _rows_in_turn(keys, 3000, 2.5, skip=[0, 3, 1, 0])
    gens = [sn.SecureGenerator(k, "cpu") for k in keys]
    for g, s in zip(gens, [0, 3, 1, 0]):
        for _ in range(s):
            g.reserve()
    got = torch.full((4, 3000), math.nan)
    _in_thread(lambda: sn.fill_normal_rows_(got, gens, 2.5))
    assert torch.equal(got, want)
    assert kernel.launches == 2 + 1  # the probe (float32, float64), then the draw
    assert [g.draws for g in gens] == [1, 4, 2, 1]
    # the noise of a step in PriFedSync: the same rows, times the std
    from dpfl.sim.noise import gaussian_noise_like, gaussian_noise_rows

    like = torch.zeros(4, 3000)
    a = [sn.SecureGenerator(k, "cpu") for k in keys]
    b = [sn.SecureGenerator(k, "cpu") for k in keys]
    rows = _in_thread(lambda: gaussian_noise_rows(like, 0.7, a))
    each = torch.stack(
        [gaussian_noise_like({"g": r}, 0.7, g)["g"] for r, g in zip(like, b)]
    )
    assert torch.equal(rows, each)


def test_rows_the_probe_rejects_or_that_fail_are_drawn_one_at_a_time(stand_in, caplog):
    keys = [bytes([k]) * 32 for k in (5, 6)]
    want, _ = _rows_in_turn(keys, 1500, 1.0, dtype=torch.float64)
    stand_in(wrong_rows=True)
    gens = [sn.SecureGenerator(k, "cpu") for k in keys]
    got = torch.empty(2, 1500, dtype=torch.float64)
    with caplog.at_level("WARNING", logger="dpfl.sim.secure_noise"):
        _in_thread(lambda: sn.fill_normal_rows_(got, gens))
    assert torch.equal(got, want)
    assert "outputs of row 2 differ" in chacha._FUSED[torch.device("cpu")].rows_why
    assert "many rows is not used" in caplog.text

    kernel = stand_in(failing_rows=True)
    chacha._FUSED[torch.device("cpu")] = chacha._Fused(
        kernel.fill_normals, kernel.fill_rows
    )
    gens = [sn.SecureGenerator(k, "cpu") for k in keys]
    got = torch.empty(2, 1500, dtype=torch.float64)
    with caplog.at_level("WARNING", logger="dpfl.sim.secure_noise"):
        sn.fill_normal_rows_(got, gens)
    assert torch.equal(got, want)  # the reserved draws, one row at a time
    assert [g.draws for g in gens] == [1, 1]
    assert chacha._fused_rows(torch.device("cpu")) is None
    assert "many rows failed" in caplog.text


def test_rows_of_seeded_generators_or_other_dtypes_are_drawn_in_turn(stand_in):
    kernel = stand_in()
    gens = [torch.Generator().manual_seed(s) for s in (1, 2)]
    got = sn.fill_normal_rows_(torch.empty(2, 50), gens, 3.0)
    want = torch.stack(
        [
            torch.empty(50).normal_(0, 3.0, generator=torch.Generator().manual_seed(s))
            for s in (1, 2)
        ]
    )
    assert torch.equal(got, want)
    keys = [bytes([k]) * 32 for k in (7, 8)]
    half, _ = _rows_in_turn(keys, 100, 1.0, dtype=torch.bfloat16)
    gens = [sn.SecureGenerator(k, "cpu") for k in keys]
    assert torch.equal(
        sn.fill_normal_rows_(torch.empty(2, 100, dtype=torch.bfloat16), gens), half
    )
    assert kernel.launches == 0  # not even probed
    with pytest.raises(InvalidParameterError, match="one generator per row"):
        sn.fill_normal_rows_(torch.empty(3, 4), gens)
