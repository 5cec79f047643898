"""The ``dpfl`` command line: its entry point (``dpfl = dpfl.cli.main:main``).

``dpfl account SCHEME ...`` and ``dpfl calibrate SCHEME ...`` print a table with
the guarantee's terms and every analysis side by side (``--json`` for scripts,
``--plot FILE`` for ε–δ and ε–rounds curves). Training commands (``train``,
``resume``, ``plot``, ``demo``) load torch lazily, so the accounting commands
work without it. The JSON is strict: a non-finite number (an ε with no finite
bound) is the string ``"inf"``, ``"-inf"`` or ``"nan"``, never the
non-standard ``Infinity`` or ``NaN``.

Errors in the input exit with status 2 and one line naming the parameter (a
value it quotes is cut to a few dozen characters); every numeric flag has a
domain (:data:`dpfl.cli.flags.FLAG_DOMAINS`), bounded where the cost of a
computation grows with the value; a missing optional dependency exits with
status 1 and one line naming the extra to install; Ctrl-C exits with status
130.

Each command group is one module of this package with an
``add_subcommands(subparsers)`` function; :func:`command_modules` finds them
(in name order, the order ``dpfl --help`` shows them), so a new command is one
new module and nothing else.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import re
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from dpfl._runtime import openmp_defaults
from dpfl.accounting._quiet import quiet as _quiet
from dpfl.cli.flags import EXIT_INTERRUPTED, Parser, check_flags, one_line
from dpfl.errors import DpflError

__all__ = ["build_parser", "command_modules", "main", "missing_extra"]

#: Exit status when an optional dependency (an extra) is not installed.
EXIT_MISSING_EXTRA = 1

#: The extra that provides each optional top-level module.
EXTRAS = {
    "torch": ("PyTorch", "train"),
    "sklearn": ("scikit-learn", "train"),
    "tqdm": ("tqdm", "train"),
    "ray": ("Ray", "ray"),
    "flwr": ("Flower", "flower"),
}

#: Library parameter names whose command-line flag is spelled differently.
FLAG_OF = {
    "participation_probability": "p",
    "record_probability": "q",
    "first_stage_probability": "q1",
    "cohort_size": "cohort",
    "sample_size": "batch_size",
}


def _flag_first(message: str, args: argparse.Namespace) -> str:
    """Prefix an error about a library parameter with the flag that set it.

    ``participation_probability must be in (0, 1]; got 1.5`` from ``--p 1.5``
    becomes ``--p: participation_probability must be ...``.
    """
    name = re.match(r"[A-Za-z_][A-Za-z0-9_]*", message)
    if name is None:
        return message
    dest = FLAG_OF.get(name.group(), name.group())
    if getattr(args, dest, None) is None or dest in ("command", "scheme", "handler"):
        return message
    return f"--{dest.replace('_', '-')}: {message}"


#: Commands whose computation grows with their inputs and is bounded in time.
_TIMED = ("account", "calibrate")


def _answer_in_time(args: argparse.Namespace) -> Any:
    """An accounting command answers within :data:`~dpfl._deadline.ANSWER_SECONDS`.

    Past it, the command is refused in one line naming its inputs (the
    accounting's cost grows with rounds and records, as epsilon grows and
    as delta shrinks); other commands run without a limit here.
    """
    import contextlib

    from dpfl._deadline import ANSWER_SECONDS, time_limit

    if getattr(args, "command", None) not in _TIMED:
        return contextlib.nullcontext()
    shown_inputs = ", ".join(
        f"--{k.replace('_', '-')} {v:g}"
        for k, v in _inputs(args).items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    )
    return time_limit(
        ANSWER_SECONDS,
        f"{args.command} {getattr(args, 'scheme', '')}: no answer within "
        f"{ANSWER_SECONDS:g} s for {shown_inputs} (the accounting's cost grows "
        "with the rounds and records, as epsilon grows and as delta shrinks); "
        "use smaller values (a larger --delta, a smaller --epsilon, fewer "
        "--rounds)",
    )


def _inputs(args: argparse.Namespace) -> dict[str, Any]:
    """The options a command ran with (for ``--json``: a script logs them)."""
    skip = {"handler", "json", "plot", "command", "default_delta"}
    return {k: v for k, v in vars(args).items() if k not in skip}


def missing_extra(exc: ModuleNotFoundError, command: str | None) -> str | None:
    """The one-line message for a missing optional dependency, else None.

    Parameters
    ----------
    exc : ModuleNotFoundError
        The import error.
    command : str or None
        The ``dpfl`` subcommand that needed it.

    Returns
    -------
    str or None
        E.g. ``"dpfl train needs PyTorch: pip install 'dpfl[train]'"``, or
        None if the module is not one an extra provides.
    """
    top = (exc.name or "").split(".")[0]
    if top not in EXTRAS:
        return None
    what, extra = EXTRAS[top]
    return f"dpfl {command or ''} needs {what}: pip install 'dpfl[{extra}]'".replace(
        "dpfl  ", "dpfl "
    )


def command_modules() -> list[ModuleType]:
    """Every command module of :mod:`dpfl.cli`, in name order.

    A command module is a module of the package (its name not starting with
    ``_``) with an ``add_subcommands(subparsers)`` function;
    :mod:`dpfl.cli.main` and :mod:`dpfl.cli.flags` have none. They are found
    on the package's ``__path__``.
    """
    import dpfl.cli

    found = []
    for info in sorted(pkgutil.iter_modules(dpfl.cli.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):  # __main__ runs the command line
            continue
        module = importlib.import_module(f"dpfl.cli.{info.name}")
        if callable(getattr(module, "add_subcommands", None)):
            found.append(module)
    return found


def build_parser() -> argparse.ArgumentParser:
    """Return the ``dpfl`` argument parser."""
    from dpfl import __version__

    parser = Parser(
        prog="dpfl",
        description="Differentially private federated learning: account, calibrate, "
        "audit, train, sweep. Accounting works without the [train] extra.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for module in command_modules():  # always: a missing extra is named on use
        module.add_subcommands(sub)
    check_flags(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    from dpfl.papers.report import Report

    if "torch" not in sys.modules:  # else libgomp has read its settings
        openmp_defaults(os.environ)
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "default_delta", None) is not None and args.delta is None:
        if args.epsilon is None:
            args.delta = args.default_delta
    try:
        with _quiet():
            with _answer_in_time(args):  # the answer; a --plot is extra work
                outcome = args.handler(args)
            if isinstance(outcome, Report):
                print(
                    outcome.to_json(_inputs(args))
                    if getattr(args, "json", False)
                    else outcome.to_table()
                )
                if getattr(args, "plot", None) and outcome.plot is not None:
                    outcome.plot(args.plot)
                    if not args.json:
                        print(f"\n  wrote {args.plot}")
                return 0
            return int(outcome or 0)
    except DpflError as exc:
        print(f"dpfl: error: {one_line(_flag_first(str(exc), args))}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path the user gave: missing, a folder, too long
        from dpfl._validate import shown

        where = "" if exc.filename is None else f"{shown(str(exc.filename))}: "
        reason = exc.strerror or type(exc).__name__
        print(f"dpfl: error: {one_line(where + reason)}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        message = missing_extra(exc, args.command)
        if message is None:
            raise
        print(f"dpfl: error: {message}", file=sys.stderr)
        return EXIT_MISSING_EXTRA
    except KeyboardInterrupt:
        # Ctrl-C outside the rounds (while the run starts or, after its last
        # round, while it writes its files): name the run and how to go on
        run: Any = getattr(args, "run_dir_hint", None)
        if run is None and args.command == "resume":
            run = args.run_dir
        hint = (
            ""
            if run is None
            else (
                f"; if {run} holds a checkpoint, continue or finish the run with: "
                f"dpfl resume {run}"
            )
        )
        print(f"dpfl: interrupted{hint}", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
