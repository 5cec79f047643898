"""Driver of tests/experiments/test_kill9.py: one ``dpfl train`` or ``resume``.

``python tests/experiments/kill9_driver.py train CONFIG.yaml`` (or ``resume
RUN_DIR``), one per process:
what the command line's ``train``/``resume`` do (:func:`dpfl.experiments.run`,
:func:`dpfl.experiments.resume`), without the accuracy figure the command line
draws at the end, so that a trial spends its time in rounds and file writes.
An error exits with status 2 and one line, as the command line does. The test
kills these processes with SIGKILL, by timer or at a ``DPFL_FAULT`` point.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    """Run ``train CONFIG`` or ``resume RUN_DIR``; returns the exit status."""
    from dpfl.errors import DpflError
    from dpfl.experiments import load_config, resume, run

    command, target = argv
    try:
        if command == "train":
            run(load_config(target), progress=False)
        elif command == "resume":
            resume(target, progress=False)
        else:
            print(f"unknown command {command!r}", file=sys.stderr)
            return 2
    except DpflError as exc:
        print(f"dpfl: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
