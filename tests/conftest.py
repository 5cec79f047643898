"""Shared test set-up: secure-noise run keys derived from the test's own id.

A run's secret key comes from the operating system's CSPRNG
(:func:`dpfl.sim.keys.new_key`), so every run of a test would train
on other noise. Tests get keys derived from their id and a counter instead:
each test is deterministic, every key it makes is distinct, and the secure
noise code paths run as they do in a real run.

Under pytest-xdist each worker runs torch on one thread.
"""

from __future__ import annotations

import hashlib
import itertools
import os

import pytest


def pytest_configure(config):
    # Under pytest-xdist (`-n 2`, as .ci/run runs) each worker has a core of
    # its own: one torch thread per worker, not two workers each spreading
    # over every core. Set before torch is imported; an explicit setting wins.
    if "PYTEST_XDIST_WORKER" in os.environ:
        os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _deterministic_run_keys(request, monkeypatch):
    try:
        from dpfl.sim import keys
    except ImportError:  # no torch: nothing draws noise
        return
    counter = itertools.count()

    def new_key() -> bytes:
        label = f"dpfl-test-key/{request.node.nodeid}/{next(counter)}"
        return hashlib.sha256(label.encode()).digest()

    monkeypatch.setattr(keys, "new_key", new_key)
