"""dpfl type-checks under the mypy settings of pyproject.toml."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # .ci/run runs it (-m slow)
def test_package_type_checks():
    # House rule: mypy strict on accounting/. pyproject.toml sets the strict
    # flags for dpfl.accounting, dpfl.errors, dpfl.cli and dpfl.papers and
    # mypy's defaults for the rest of the package; untyped third-party
    # packages are ignored. ~15 s, no cache written.
    mypy_api = pytest.importorskip("mypy.api")
    out, err, status = mypy_api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            "/dev/null",
            str(ROOT / "src" / "dpfl"),
        ]
    )
    assert status == 0, out + err
    assert "Success" in out
