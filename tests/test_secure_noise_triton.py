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
* on CUDA (``-m gpu``): the fused kernel is what a draw uses, and its
  outputs equal the torch operations' bit for bit for several keys, draws,
  lengths, dtypes and scales.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

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
    block = ct.keystream_words(sn._initial_state(key, nonce, 1), 1, "cpu")
    assert block.numpy().astype("<u4").tobytes().hex() == (
        "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
        "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
    )
    for counter, n in ((0, 70), (2**31 - 3, 9), (2**32 - 40, 40)):
        state = sn._initial_state(key, bytes(range(12)), counter)
        mine = ct.keystream_words(state, n, "cpu").numpy().astype("<u4").tobytes()
        assert mine == sn.chacha20_keystream(key, bytes(range(12)), counter, n)

    def numpy_normals(state, g0, n, scale, dtype):
        # the torch path's operations, in numpy (the interpreter's math)
        groups = -(-n // sn.GROUP)
        init = torch.tensor(state, dtype=torch.int64)
        init[12] += g0 * sn._GROUP_BLOCKS
        s = sn._words(init, groups * sn._GROUP_BLOCKS).view(groups, 4, sn.GROUP)
        s = s.numpy()
        r = np.sqrt(np.log((s[:, :2] + (2**52 + 1)).astype(np.float64) * 2.0**-53)
                    * -2.0)
        t = s[:, 2:].astype(np.float64) * (np.pi * 2.0**-52)
        c = (np.cos(t) + np.sin(t)) * r
        return torch.from_numpy(((c[:, 0] + c[:, 1]).reshape(-1)[:n] * scale)
                                .astype(dtype))

    stream = sn.derive_key(bytes(range(1, 33)), "noise")
    for draw, g0, n, scale in ((0, 0, 1, 0.5), (5, 0, 2 * 1024 + 37, 0.85),
                               (2**40 + 3, 2**22 - 1, 2 * 1024, 0.65),
                               (7, 2**23 - 2, 2 * 1024, 0.5)):
        state = sn._initial_state(stream, sn._nonce(draw), 0)
        for dtype, npdtype in ((torch.float32, np.float32),
                               (torch.float64, np.float64)):
            got = torch.full((n,), float("nan"), dtype=dtype)
            ct.fill_normals(got, state, scale, first=g0 * 1024, libdevice=False)
            assert torch.equal(got, numpy_normals(state, g0, n, scale, npdtype)), (
                draw, n, dtype)
            if dtype == torch.float32:
                want = torch.empty(n, dtype=dtype)
                sn._fill_groups(state, g0, want, scale, sn._words)
                assert torch.equal(got, want), (draw, n)
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
    assert sn.noise_kernel(device) == "triton", sn._FUSED.get(device)
    for counter, n in ((0, 1500), (2**31 - 300, 600), (2**32 - 600, 600)):
        state = sn._initial_state(bytes(range(32)), bytes(range(12)), counter)
        words = ct.keystream_words(state, n, device).cpu().numpy()
        assert words.astype("<u4").tobytes() == sn.chacha20_keystream(
            bytes(range(32)), bytes(range(12)), counter, n
        )
    for seed, draw, n, std in (
        (1, 0, 1, 1.0),
        (2, 3, 8, 2.5),
        (3, 2**63 + 5, 1023, 0.1),
        (4, 17, 4096 + 5, 1.0),
        (5, 9, 1_000_003, 3.0),
    ):
        stream = sn.derive_key(bytes([seed]) * 32, "noise")
        for dtype in (torch.float32, torch.float64):
            want = torch.empty(n, dtype=dtype, device=device)
            sn._fill_torch(stream, draw, want, 0.5 * std, compiled=False)
            got = torch.full((n,), float("nan"), dtype=dtype, device=device)
            sn._fill_chacha20(stream, draw, got, std)  # the fused kernel
            assert torch.equal(got, want), (seed, draw, n, dtype)
