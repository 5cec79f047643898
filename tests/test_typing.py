"""The accounting core type-checks under the strict mypy settings of pyproject.toml."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_accounting_core_type_checks_strictly():
    # STYLE.md: "mypy strict on accounting/". The settings (strict flags for
    # dpfl.accounting and dpfl.errors; untyped third-party packages ignored)
    # live in pyproject.toml; no cache is written.
    mypy_api = pytest.importorskip("mypy.api")
    out, err, status = mypy_api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            "/dev/null",
            str(ROOT / "src" / "dpfl" / "accounting"),
        ]
    )
    assert status == 0, out + err
    assert "Success" in out
