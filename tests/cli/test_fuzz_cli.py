"""Property-based fuzzing of every ``dpfl`` subcommand's flags (hypothesis).

Each example is one command line: a valid base command of a subcommand with
one or more flag values replaced by a drawn value (0, -1, huge integers,
NaN, infinities, tiny and huge floats, empty strings, control characters and
binary junk, very long strings, words). The command must end in one of two
ways, within a time bound:

* exit 0 with a valid result (``--json``: strict JSON, no ``NaN`` or
  ``Infinity``), and only if every drawn value lies in its flag's domain
  (:data:`dpfl.cli.flags.FLAG_DOMAINS`), so no invalid value is accepted
  silently;
* exit 2 with exactly one short line on stderr that names the flag (or, for
  a constraint between flags, the library parameter it set).

Never a traceback, never a hang. The default run parses every subcommand
and runs the cheap accounting commands to completion (derandomized, a fixed
number of examples, about half a minute); the ``slow`` profile draws many
more examples and runs every accounting and audit command to completion.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import math
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpfl.cli.flags import FLAG_DOMAINS
from dpfl.cli.main import build_parser, main

#: Seconds one command may take before the example fails as a hang.
HANG_SECONDS = 60

#: A valid command per subcommand; ``cheap`` ones run to completion in the
#: default test run, the others only parse there (their accounting takes
#: seconds to a minute per command) and run in the slow profile.
BASES: dict[str, tuple[list[str], bool]] = {
    "account gaussian": (["--noise-multiplier", "2", "--delta", "1e-5"], True),
    "calibrate gaussian": (["--epsilon", "1", "--delta", "1e-5"], True),
    "account dp-fedavg": (
        ["--clients", "100", "--cohort", "10", "--rounds", "5"]
        + ["--noise-multiplier", "1", "--threshold", "0.001", "--epsilon", "2"],
        True,
    ),
    "calibrate dp-fedavg": (
        ["--clients", "100", "--cohort", "10", "--rounds", "5"]
        + ["--epsilon", "4", "--delta", "1e-5"],
        True,
    ),
    "account ms-pafl": (
        ["--noise-multiplier", "2", "--rounds", "3", "--rounds-joined", "2"]
        + ["--clients", "100", "--probability", "0.5", "--batch-size", "32"]
        + ["--dataset-size", "325", "--local-steps", "1", "--xi", "0.5"]
        + ["--local-delta", "1e-5", "--delta", "1e-5"],
        True,
    ),
    "account locks": (
        ["--q1", "0.1", "--max-p2", "1", "--rounds", "3", "--noise-multiplier"]
        + ["2", "--norm-rounds", "3", "--update-rounds", "2"]
        + ["--norm-noise-ratio", "4", "--delta", "1e-5"],
        True,
    ),
    "audit gaussian": (
        ["--noise-multiplier", "2", "--trials", "200", "--confidence", "0.95"]
        + ["--seed", "0", "--delta", "1e-5"],
        True,
    ),
    "account random-participation": (
        ["--p", "0.1", "--q", "0.5", "--records-per-client", "3", "--rounds", "2"]
        + ["--noise-multiplier", "2"],
        False,
    ),
    "calibrate random-participation": (
        ["--p", "0.1", "--q", "0.5", "--records-per-client", "3", "--rounds", "2"]
        + ["--epsilon", "4", "--delta", "1e-5"],
        False,
    ),
    "account prifedsync": (
        ["--noise-multiplier", "2", "--batch-size", "8", "--records-per-client"]
        + ["100", "--local-steps", "2", "--rounds", "2", "--num-clients", "10"]
        + ["--guarantee", "strong"],
        False,
    ),
    "calibrate prifedsync": (
        ["--batch-size", "8", "--records-per-client", "100", "--local-steps", "2"]
        + ["--rounds", "2", "--num-clients", "10", "--epsilon", "4", "--delta"]
        + ["1e-5"],
        False,
    ),
    "calibrate ms-pafl": (
        ["--rounds", "3", "--clients", "100", "--probability", "0.5"]
        + ["--epsilon", "4", "--delta", "1e-5"],
        False,
    ),
    "calibrate locks": (
        ["--q1", "0.1", "--rounds", "3", "--epsilon", "4", "--delta", "1e-5"]
        + ["--max-p2", "1", "--norm-noise-ratio", "4"],
        False,
    ),
    "audit random-participation": (
        ["--p", "0.5", "--q", "0.5", "--records-per-client", "3"]
        + ["--noise-multiplier", "2", "--rounds", "1", "--trials", "200"]
        + ["--confidence", "0.95", "--seed", "0", "--angle", "90"],
        False,
    ),
    "audit dp-fedavg": (
        ["--noise-multiplier", "2", "--clients", "5", "--canaries", "5"]
        + ["--rounds", "1", "--runs", "1", "--hidden", "8", "--clip", "1"]
        + ["--participation", "0.5", "--confidence", "0.95", "--seed", "0"],
        False,
    ),
    "audit dp-dsgd": (
        ["--noise-multiplier", "2", "--clients", "5", "--canaries", "5"]
        + ["--rounds", "1", "--runs", "1", "--hidden", "8", "--p", "0.5"]
        + ["--q", "0.5", "--confidence", "0.95", "--seed", "0"],
        False,
    ),
    "demo": (["--rounds", "2", "--out", "demo-out"], False),
    "reproduce": (["ms-pafl", "--seeds", "1", "--jobs", "1"], False),
    "sweep": (["no-such.yaml", "--seeds", "0-1", "--jobs", "1"], False),
}

#: Values a flag is given: edge cases first, then random ones.
EDGES = [
    "0", "-1", "1", "2", "-0.0", "1e-300", "5e-324", "1.0000001", "1e300",
    "1e308", "1e400", "-1e400", "1e-400", "nan", "inf", "-inf", "", " ",
    "abc", "\x00\xff", "\n", "9" * 5000, "1" + "0" * 400, "1000000000000",
    "0x10", "1e3", " 3", "1_000", "1e-6_0", "--json",
    # other scripts' digits and spaces: one spelling of numbers, refused
    "\uff11", "\uff10.\uff15", "\u0661", "\u0660.\u0665", "1\u00a0",
    "\u00a00.5", "1\u2009000",
    # booleans as words are not numbers
    "yes", "no", "true", "false",
]  # fmt: skip

VALUES = st.one_of(
    st.sampled_from(EDGES),
    st.integers(-(10**15), 10**15).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=30),
)


def _pairs(args: list[str]) -> list[tuple[str, str | None]]:
    """``[--flag, value, --switch, ...]`` as (flag, value or None) pairs."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        if args[i].startswith("--") and (
            i + 1 == len(args) or args[i + 1].startswith("--")
        ):
            out.append((args[i], None))
            i += 1
        elif args[i].startswith("--"):
            out.append((args[i], args[i + 1]))
            i += 2
        else:  # a positional
            out.append(("", args[i]))
            i += 1
    return out


def _argv(command: str, pairs: list[tuple[str, str | None]]) -> list[str]:
    """The command line; ``--flag=-1`` keeps a value from reading as a flag."""
    argv = command.split()
    for flag, value in pairs:
        if flag and value is not None and value.startswith("-"):
            argv.append(f"{flag}={value}")
            continue
        if flag:
            argv.append(flag)
        if value is not None:
            argv.append(value)
    return argv


@functools.cache
def _domains() -> dict[tuple[str, str], Any]:
    """(command, flag) -> the domain the parser checks that flag's value by."""
    out: dict[tuple[str, str], Any] = {}

    def walk(parser: argparse.ArgumentParser) -> None:
        command = parser.prog.partition(" ")[2]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)
            elif callable(action.type) and hasattr(action.type, "describe"):
                for flag in action.option_strings:
                    out[command, flag] = action.type

    walk(build_parser())
    return out


def _in_domain(command: str, flag: str, text: str) -> bool | None:
    """Whether ``text`` lies in ``flag``'s domain (None: not a numeric flag)."""
    domain = _domains().get((command, flag))
    if domain is None:
        return None
    try:
        domain(text)
    except argparse.ArgumentTypeError:
        return False
    return True


class _Hang(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    def on_alarm(signum: int, frame: Any) -> None:
        raise _Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_cli(argv: list[str], *, parse_only: bool = False) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of ``dpfl argv`` run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with (
        _time_limit(HANG_SECONDS),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            if parse_only:
                build_parser().parse_args(argv)
                status = 0
            else:
                status = main(argv)
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
    return status, out.getvalue(), err.getvalue()


def _strict(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"--json printed {name}, which JSON does not have")

    return json.loads(text, parse_constant=refuse)


#: The ways an input can fail to answer (:func:`verdict`); ``hang`` is an
#: input that ran past :data:`HANG_SECONDS` (:func:`run_cli` raises
#: :class:`_Hang`), ``traceback`` also one whose exception left ``main``.
FAILURES = (
    "traceback",
    "hang",
    "silent accept",
    "unclear refusal",
    "exit status",
    "invalid output",
)


def verdict(
    argv: list[str],
    status: int,
    out: str,
    err: str,
    *,
    invalid: list[str],
    named: bool = True,
) -> tuple[str, str] | None:
    """How an outcome breaks the rule, as (one of :data:`FAILURES`, detail).

    The rule: exit 0 with a valid result, or exit 2 with one line; nothing
    else. ``invalid``: the flags (or keys) given invalid values; the command
    must refuse, and (if ``named``) its line must name one of them. ``None``:
    the input answered as it must. Shared by the tests
    (:func:`check_outcome`) and the fuzz report (``benchmarks/fuzz.py``), so
    that both count by one rule.
    """
    if "Traceback" in err:
        return "traceback", err[-2000:]
    if status not in (0, 2):
        return "exit status", f"{argv} exited {status}: {err[-500:]}"
    if status == 0:
        if invalid:
            return "silent accept", f"accepted silently: {invalid} in {argv}"
        if "--json" in argv and out.strip():
            try:
                _strict(out)
            except ValueError as exc:
                return "invalid output", f"{argv}: {exc}"
        return None
    lines = err.strip().splitlines()
    if len(lines) != 1 or len(lines[0]) > 600 or "error" not in lines[0]:
        return "unclear refusal", f"{argv}: {err[:2000]}"
    if invalid and named and not any(flag in lines[0] for flag in invalid):
        return "unclear refusal", f"{argv} names none of {invalid}: {lines[0]}"
    return None


def check_outcome(
    argv: list[str],
    status: int,
    out: str,
    err: str,
    *,
    invalid: list[str],
    named: bool = True,
) -> None:
    """Exit 0 with a valid result, or exit 2 with one line (:func:`verdict`)."""
    found = verdict(argv, status, out, err, invalid=invalid, named=named)
    assert found is None, f"{found[0]}: {found[1]}"


def test_the_verdict_names_each_way_of_not_answering() -> None:
    # the rule the tests assert and benchmarks/fuzz.py counts by
    ok = "dpfl: error: --delta must be in (0, 1); got 2\n"
    assert verdict(["x", "--delta", "2"], 2, "", ok, invalid=["--delta"]) is None
    assert verdict(["x"], 0, "done\n", "", invalid=[]) is None
    cases = [
        ((0, "done", ""), ["--delta"], "silent accept"),
        ((2, "", "Traceback (most recent call last):\n..."), [], "traceback"),
        ((1, "", "dpfl: error: x\n"), [], "exit status"),
        ((2, "", "dpfl: error: a\nand more\n"), [], "unclear refusal"),
        ((2, "", "dpfl: error: something else\n"), ["--delta"], "unclear refusal"),
        ((0, "NaN", ""), [], "invalid output"),
    ]
    for (status, out, err), invalid, kind in cases:
        argv = ["account", "gaussian", "--json"]
        found = verdict(argv, status, out, err, invalid=invalid)
        assert found is not None and found[0] == kind, (status, out, err, found)
        assert kind in FAILURES


#: Flags the cost of a computation grows with. Where a command runs to
#: completion in the default test run, their in-domain values stay moderate
#: (their caps are the accounting core's time bound, which
#: benchmarks/accounting_grid.py measures); out-of-domain values (huge,
#: negative, non-numbers) are drawn as for every flag.
COSTLY = {
    "--rounds", "--records-per-client", "--local-steps", "--clients", "--cohort",
    "--batch-size", "--dataset-size", "--trials", "--rounds-joined",
    "--norm-rounds", "--update-rounds", "--num-clients",
}  # fmt: skip

MODERATE = st.one_of(st.sampled_from(EDGES), st.integers(-5, 300).map(str))


@st.composite
def command_lines(draw: Any, cheap_only: bool) -> tuple[str, list[str], list[str]]:
    names = sorted(c for c, (_, cheap) in BASES.items() if cheap or not cheap_only)
    command = draw(st.sampled_from(names))
    pairs = _pairs(BASES[command][0])
    invalid: list[str] = []
    k = draw(st.integers(1, 2))
    for _ in range(k):
        i = draw(st.integers(0, len(pairs) - 1))
        flag, value = pairs[i]
        if value is None or not flag:
            continue
        new = draw(MODERATE if cheap_only and flag in COSTLY else VALUES)
        if "\x00" in new:  # argv cannot hold NUL (exec refuses it)
            new = new.replace("\x00", "")
        pairs[i] = (flag, new)
        if _in_domain(command, flag, new) is False:
            invalid.append(flag)
    if command.split()[0] in ("account", "calibrate"):
        pairs.append(("--json", None))  # one analysis (the table prices all)
    return command, _argv(command, pairs), invalid


def _invalid_now(command: str, argv: list[str]) -> list[str]:
    """Flags whose (last) value in ``argv`` is outside their domain."""
    seen: dict[str, str] = {}
    for a in argv:
        if a.startswith("--") and "=" in a:
            flag, _, value = a.partition("=")
            seen[flag] = value
    i = 0
    while i < len(argv) - 1:
        if argv[i].startswith("--") and "=" not in argv[i]:
            seen[argv[i]] = argv[i + 1]
        i += 1
    return [f for f, v in seen.items() if _in_domain(command, f, v) is False]


def _check(command: str, argv: list[str], parse_only: bool) -> None:
    status, out, err = run_cli(argv, parse_only=parse_only)
    check_outcome(argv, status, out, err, invalid=_invalid_now(command, argv))


FAST = settings(
    max_examples=60,
    derandomize=True,
    deadline=None,  # the time bound is HANG_SECONDS, enforced by an alarm
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@FAST
@given(command_lines(cheap_only=False))
def test_every_subcommand_parses_or_refuses_in_one_line(case: Any) -> None:
    command, argv, _ = case
    _check(command, argv, parse_only=True)


@FAST
@given(command_lines(cheap_only=True))
def test_cheap_accounting_commands_answer_or_refuse(case: Any) -> None:
    command, argv, _ = case
    _check(command, argv, parse_only=False)


@pytest.mark.slow
@settings(FAST, max_examples=600)
@given(command_lines(cheap_only=True))
def test_cheap_accounting_commands_many(case: Any) -> None:
    command, argv, _ = case
    _check(command, argv, parse_only=False)


#: Commands the slow profile runs in full (training and downloads excluded:
#: train is fuzzed through its configuration, tests/cli/test_fuzz_config.py).
_ACCOUNTING = sorted(c for c in BASES if c.split()[0] in ("account", "calibrate"))


@pytest.mark.slow
@settings(FAST, max_examples=30)
@given(
    st.sampled_from(_ACCOUNTING + ["audit random-participation"]),
    st.data(),
)
def test_every_accounting_command_answers_or_refuses(command: str, data: Any) -> None:
    pairs = _pairs(BASES[command][0])
    i = data.draw(st.integers(0, len(pairs) - 1))
    flag, value = pairs[i]
    if value is not None and flag:
        # the cost flags stay moderate here: their caps are the accounting
        # core's time bound, measured by benchmarks/accounting_grid.py
        costly = flag in ("--rounds", "--records-per-client", "--local-steps")
        new = data.draw(
            st.integers(-5, 200).map(str) if costly else VALUES, label=flag
        ).replace("\x00", "")
        pairs[i] = (flag, new)
    argv = _argv(command, [*pairs, ("--json", None)])
    _check(command, argv, parse_only=False)


# -- the other subcommands: arguments that are paths, names and words -----------
PATHS = st.one_of(
    st.sampled_from(
        ["", ".", "..", "/", "/nonexistent/x", "no-such-dir", "a" * 5000, "\n", "-"]
        + ["/dev/zero", "/dev/null", "/dev/stdin", "/proc/self/fd/0"]
    ),
    st.text(max_size=40).map(lambda s: s.replace("\x00", "")),
)


@contextlib.contextmanager
def _inside(folder: Any) -> Iterator[None]:
    here = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(here)


@FAST
@given(path=PATHS)
def test_run_folder_commands_refuse_what_is_not_a_run(
    tmp_path_factory: Any, path: str
) -> None:
    empty = tmp_path_factory.mktemp("cwd")
    for argv in (
        ["resume", path, "--no-progress"],
        ["plot", path],
        ["train", path, "--check"],
        ["sweep", path, "--seeds", "0"],
    ):
        if path.startswith("-"):
            argv = [argv[0], "--", *argv[1:]]
        with _inside(empty):
            status, out, err = run_cli(argv)
        check_outcome(argv, status, out, err, invalid=[])
        assert status == 2, (argv, out)


def test_commands_given_a_fifo_answer_without_blocking(tmp_path: Any) -> None:
    # `dpfl train FIFO --check` blocked forever: opening a FIFO for reading
    # waits for a writer. Every command that reads a path refuses it at once.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    (tmp_path / "folder").mkdir()
    os.mkfifo(tmp_path / "folder" / "config.yaml")  # a run folder's config
    for argv in (
        ["train", str(fifo), "--check"],
        ["train", str(fifo)],
        ["sweep", str(fifo), "--seeds", "0"],
        ["resume", str(fifo), "--no-progress"],
        ["resume", str(tmp_path / "folder"), "--no-progress"],
        ["plot", str(fifo)],
    ):
        with _inside(tmp_path):
            status, out, err = run_cli(argv)
        check_outcome(argv, status, out, err, invalid=[])
        assert status == 2, (argv, out)


@FAST
@given(st.text(max_size=40).map(lambda s: s.replace("\x00", "")))
def test_sweep_seeds_refuse_in_one_line(text: str) -> None:
    from dpfl.errors import InvalidParameterError
    from dpfl.experiments.sweep import MAX_SEEDS, parse_seeds

    with _time_limit(HANG_SECONDS):
        try:
            seeds = parse_seeds(text)
        except InvalidParameterError as exc:
            assert "\n" not in str(exc) and len(str(exc)) < 300
            return
    assert 1 <= len(seeds) <= MAX_SEEDS and all(s >= 0 for s in seeds)


def test_sweep_refuses_a_huge_seed_range_at_once() -> None:
    status, _, err = run_cli(["sweep", "x.yaml", "--seeds", "0-1000000000000"])
    assert status == 2 and "at most 1000 seeds" in err


@FAST
@given(st.text(max_size=40).map(lambda s: s.replace("\x00", "")))
def test_data_list_with_any_root(root: str) -> None:
    argv = ["data", "list", f"--root={root}"]
    status, out, err = run_cli(argv)
    check_outcome(argv, status, out, err, invalid=[])


def test_every_numeric_flag_has_a_domain() -> None:
    """build_parser refuses a numeric flag without a domain; all are bounded."""
    parser = build_parser()
    assert parser is not None
    for dest, domain in FLAG_DOMAINS.items():
        assert domain.low > -math.inf and domain.high >= domain.low, dest
        if dest in ("rounds", "records_per_client", "local_steps", "trials"):
            assert domain.high < math.inf, dest  # cost grows with these


def test_json_never_prints_infinity(capsys: Any) -> None:
    from dpfl.papers.report import Report

    report = Report("t", {"epsilon": math.inf, "ratio": -math.inf, "x": math.nan})
    out = _strict(report.to_json({"epsilon": math.inf}))
    assert out["epsilon"] == "inf" and out["ratio"] == "-inf" and out["x"] == "nan"
    assert out["inputs"] == {"epsilon": "inf"}
