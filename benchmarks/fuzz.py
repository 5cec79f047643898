"""Fuzz report: every input answers; how many were tried, and how many did not.

Draws inputs from the fuzz harness of the tests (``tests/cli/test_fuzz_cli.py``
and ``tests/cli/test_fuzz_config.py``: the same strategies, the same rule) and
runs each through ``dpfl`` in this process, as the tests do, but counts
instead of stopping at the first failure. The rule
(:func:`test_fuzz_cli.verdict`): exit 0 with a valid result (and only if no
value known to be invalid was given), or exit 2 with one short line naming
the flag or key, within 60 s. Prints, per family of inputs and in all, the
inputs tried and how many gave

* a traceback (an exception left ``main``, or one was printed),
* a hang (no answer within 60 s),
* a silent accept (exit 0 though a value outside its domain was given),
* an unclear refusal (exit 2 but not one line, or not naming the value),
* another exit status, or invalid ``--json`` output,

the slowest answer, and the first ten failures; then the command
that produced the figures. Exit status 1 if any input failed.

Families: every subcommand's flags parsed (all values drawn); the cheap
accounting commands run to completion; every accounting command run to
completion (``--full``: minutes); the run-folder commands given paths
(``resume``, ``plot``, ``train --check``, ``sweep``) and FIFOs; files that
are not configurations; mutated presets and tiny runs checked by ``dpfl
train --check``; ``--set`` overrides.

Run: python benchmarks/fuzz.py [--examples 100] [--seed 0] [--full]
     [--only FAMILY]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path[:0] = [str(TESTS / "cli"), str(TESTS)]  # the harness, its helpers

import test_fuzz_cli as cli  # noqa: E402
import test_fuzz_config as cfg  # noqa: E402


class Tally:
    """Counts of outcomes for one family of inputs."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tried = 0
        self.answered = 0
        self.refused = 0
        self.failures: collections.Counter[str] = collections.Counter()
        self.examples: list[str] = []
        self.slowest = 0.0

    def run(
        self,
        argv: list[str],
        invalid: list[str],
        named: bool,
        context: str = "",
        **kw: Any,
    ) -> None:
        """Run ``dpfl argv`` and count what it did.

        ``context``: shown with a failure (the configuration file it read).
        """
        self.tried += 1
        start = time.monotonic()
        found: tuple[str, str] | None
        try:
            status, out, err = cli.run_cli(argv, **kw)
        except cli._Hang as exc:
            found = ("hang", f"{argv}: {exc}")
        except Exception as exc:  # left main: a traceback
            found = ("traceback", f"{argv}: {type(exc).__name__}: {exc}")
        else:
            found = cli.verdict(argv, status, out, err, invalid=invalid, named=named)
            if found is None:
                if status == 0:
                    self.answered += 1
                else:
                    self.refused += 1
        self.slowest = max(self.slowest, time.monotonic() - start)
        if found is not None:
            self.failures[found[0]] += 1
            if len(self.examples) < 10:
                shown = f"{found[0]}: {found[1][:600]}"
                if context:
                    shown += f" <- given: {context[:1500]}"
                self.examples.append(shown)


@contextlib.contextmanager
def _folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dpfl-fuzz-") as tmp:
        with cli._inside(tmp):
            yield Path(tmp)


def _drive(
    strategy: st.SearchStrategy[Any],
    examples: int,
    seed_: int,
    body: Callable[[Any], None],
) -> None:
    """Call ``body`` on ``examples`` values drawn from ``strategy``."""

    @seed(seed_)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def probe(value: Any) -> None:
        body(value)

    probe()


# -- the families --------------------------------------------------------------------
def flags_parsed(t: Tally, n: int, s: int) -> None:
    def body(case: Any) -> None:
        command, argv, _ = case
        t.run(argv, cli._invalid_now(command, argv), True, parse_only=True)

    _drive(cli.command_lines(cheap_only=False), n, s, body)


def cheap_commands_run(t: Tally, n: int, s: int) -> None:
    def body(case: Any) -> None:
        command, argv, _ = case
        t.run(argv, cli._invalid_now(command, argv), True)

    _drive(cli.command_lines(cheap_only=True), n, s, body)


def every_accounting_command_run(t: Tally, n: int, s: int) -> None:
    commands = cli._ACCOUNTING + ["audit random-participation"]

    @st.composite
    def lines(draw: Any) -> tuple[str, list[str]]:
        command = draw(st.sampled_from(commands))
        pairs = cli._pairs(cli.BASES[command][0])
        i = draw(st.integers(0, len(pairs) - 1))
        flag, value = pairs[i]
        if value is not None and flag:
            costly = flag in ("--rounds", "--records-per-client", "--local-steps")
            new = draw(st.integers(-5, 200).map(str) if costly else cli.VALUES)
            pairs[i] = (flag, new.replace("\x00", ""))
        return command, cli._argv(command, [*pairs, ("--json", None)])

    def body(case: Any) -> None:
        command, argv = case
        t.run(argv, cli._invalid_now(command, argv), True)

    _drive(lines(), n, s, body)


def paths(t: Tally, n: int, s: int) -> None:
    def body(path: str) -> None:
        for argv in (
            ["resume", path, "--no-progress"],
            ["plot", path],
            ["train", path, "--check"],
            ["sweep", path, "--seeds", "0"],
        ):
            if path.startswith("-"):
                argv = [argv[0], "--", *argv[1:]]
            with _folder():  # an empty folder: nothing there is a run
                t.run(argv, ["a path that is not a run"], False)

    _drive(cli.PATHS, n, s, body)
    with _folder() as tmp:
        os.mkfifo(tmp / "pipe")
        (tmp / "folder").mkdir()
        os.mkfifo(tmp / "folder" / "config.yaml")
        for argv in (
            ["train", "pipe", "--check"],
            ["train", "pipe"],
            ["sweep", "pipe", "--seeds", "0"],
            ["resume", "pipe", "--no-progress"],
            ["resume", "folder", "--no-progress"],
            ["plot", "pipe"],
        ):
            t.run(argv, ["a FIFO"], False)


def _check(t: Tally, text: bytes, invalid: list[str], named: bool) -> None:
    with _folder() as tmp:
        (tmp / "run.yaml").write_bytes(text)
        shown = text.decode("utf-8", "replace")
        try:  # one line: the configuration in YAML's flow style
            shown = yaml.safe_dump(yaml.safe_load(text), default_flow_style=True)
        except Exception:  # not YAML, too deep, a huge integer: shown as text
            pass
        t.run(["train", "run.yaml", "--check"], invalid, named, context=shown)


def not_configurations(t: Tally, n: int, s: int) -> None:
    for kind, text in sorted(cfg.RAW.items()):
        _check(t, text, [cfg.NAMED.get(kind, "")], True)


def mutated_presets(t: Tally, n: int, s: int) -> None:
    _drive(cfg.mutated(presets=True), n, s, lambda c: _check(t, c[0], c[1], False))


def mutated_tiny_runs(t: Tally, n: int, s: int) -> None:
    _drive(cfg.mutated(presets=False), n, s, lambda c: _check(t, c[0], c[1], False))


def set_overrides(t: Tally, n: int, s: int) -> None:
    def body(case: Any) -> None:
        path, value = case
        try:
            text = yaml.safe_dump(value, default_flow_style=True).strip()
        except yaml.YAMLError:
            return
        if text.endswith("..."):
            text = text.rsplit("...", 1)[0].strip()
        known = cfg._known_invalid(path, value, cfg._get(cfg.TINY, path))
        with _folder() as tmp:
            (tmp / "run.yaml").write_bytes(cfg._dump(cfg.TINY))
            argv = ["train", "run.yaml", "--check", "--set"]
            argv.append(f"{'.'.join(path)}={text}")
            t.run(argv, [path[-1]] if known else [], True)

    _drive(st.tuples(st.sampled_from(cfg._leaves(cfg.TINY)), cfg.VALUES), n, s, body)


PLURAL = {
    "traceback": "tracebacks",
    "hang": "hangs",
    "silent accept": "silent accepts",
    "unclear refusal": "unclear refusals",
    "exit status": "other exit statuses",
    "invalid output": "invalid outputs",
}

#: name -> (driver, runs only with --full)
FAMILIES: dict[str, tuple[Callable[[Tally, int, int], None], bool]] = {
    "flags parsed (every subcommand)": (flags_parsed, False),
    "cheap accounting commands run": (cheap_commands_run, False),
    "every accounting command run": (every_accounting_command_run, True),
    "paths and FIFOs to run-folder commands": (paths, False),
    "files that are not configurations": (not_configurations, False),
    "mutated presets (train --check)": (mutated_presets, False),
    "mutated tiny runs (train --check)": (mutated_tiny_runs, False),
    "--set overrides (train --check)": (set_overrides, False),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--examples", type=int, default=100, help="inputs drawn per family"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--full", action="store_true", help="also run every accounting command"
    )
    parser.add_argument("--only", help="the families whose name holds this text")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print(f"python {platform.python_version()}, {platform.machine()}")
    tallies = []
    start = time.monotonic()
    for name, (drive, full) in FAMILIES.items():
        if (full and not args.full) or (args.only and args.only not in name):
            continue
        t = Tally(name)
        began = time.monotonic()
        drive(t, args.examples, args.seed)
        tallies.append(t)
        failed = sum(t.failures.values())
        print(
            f"{name:42s} {t.tried:5d} tried  {t.answered:5d} answered  "
            f"{t.refused:5d} refused  {failed:3d} failed  "
            f"slowest {t.slowest:5.1f} s  ({time.monotonic() - began:.0f} s)"
        )
        for example in t.examples:
            print("    " + example.replace("\n", " | "))
    total: collections.Counter[str] = collections.Counter()
    for t in tallies:
        total.update(t.failures)
    tried = sum(t.tried for t in tallies)
    print()
    print(
        f"inputs tried: {tried} in {time.monotonic() - start:.0f} s; "
        + ", ".join(f"{PLURAL[kind]}: {total[kind]}" for kind in cli.FAILURES)
        + f"; slowest answer {max((t.slowest for t in tallies), default=0):.1f} s"
    )
    print("command:", shlex.join(["python", *sys.argv]))
    return 1 if sum(total.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
