"""Shared test set-up: secure-noise run keys derived from the test's own id.

A run's secret key comes from the operating system's CSPRNG
(:func:`dpfl.sim.keys.new_key`), so every run of a test would train
on other noise. Tests get keys derived from their id and a counter instead:
each test is deterministic, every key it makes is distinct, and the secure
noise code paths run as they do in a real run.
"""

from __future__ import annotations

import hashlib
import itertools

import pytest


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
