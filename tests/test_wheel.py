"""The wheel as a user installs it: presets inside, the console script works.

Slow (about a minute: building the wheel and a virtual environment, then
starting ``dpfl`` three times), so it runs under ``-m slow`` (``.ci/run``).
The venv sees the system's packages (``--system-site-packages``) so that
torch is not downloaded again; the test checks that ``dpfl`` is imported from
the wheel in the venv, not from this checkout or the system.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, (cmd, done.stdout, done.stderr)
    return done.stdout


@pytest.mark.slow  # builds a wheel and a venv: a minute or more
def test_the_wheel_ships_the_presets_and_its_commands_run(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PIP_NO_INDEX"] = "1"  # nothing is downloaded: the build uses what is here
    wheels = tmp_path / "wheels"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        tmp_path,
        env,
    )
    (wheel,) = wheels.glob("dpfl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {Path(n).stem for n in names if n.startswith("dpfl/presets/")}
    assert shipped == {p.stem for p in (ROOT / "src/dpfl/presets").glob("*.yaml")}
    assert any(n.endswith("LICENSE") for n in names)

    venv = tmp_path / "venv"
    _run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
        tmp_path,
        env,
    )
    python, dpfl = venv / "bin" / "python", venv / "bin" / "dpfl"
    _run(
        [str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)],
        tmp_path,
        env,
    )
    where = _run(
        [str(python), "-c", "import dpfl; print(dpfl.__file__)"], tmp_path, env
    ).strip()
    assert Path(where).is_relative_to(venv), where  # the wheel's, not a checkout's

    assert _run([str(dpfl), "--version"], tmp_path, env).startswith("dpfl 0.")
    # accounting without torch: the command never imports it
    code = (
        "import sys; from dpfl.cli.main import main; "
        "rc = main(['account', 'dp-fedavg', '--clients', '1000', '--cohort', '100', "
        "'--rounds', '100', '--noise-multiplier', '1.0']); "
        "assert rc == 0 and 'torch' not in sys.modules, rc"
    )
    table = _run([str(python), "-c", code], tmp_path, env)
    assert "epsilon" in table
    out = _run(
        [str(dpfl), "reproduce", "locks", "--scale", "smoke", "--check"], tmp_path, env
    )
    assert out.startswith("locks: valid: preset locks-digits") and str(venv) in out
    listed = _run([str(dpfl), "presets", "list"], tmp_path, env)
    assert len(listed.splitlines()) == len(shipped)
