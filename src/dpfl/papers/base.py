"""What a paper registers: :class:`Paper` and :class:`Audit`, and their shared flags.

A paper module (``dpfl.papers.dsgd_rp``, ...) builds one :class:`Paper`: its
flags, the handlers of ``dpfl account`` and ``dpfl calibrate`` that turn
those flags into the scheme's event and price it, the analyses its tables
show (with their status), its audits (``dpfl audit``) and its reproduction
(``dpfl reproduce``). :mod:`dpfl.papers` lists every paper once; the command
line reads everything from that list.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dpfl.experiments.reproduce import Reproduction
    from dpfl.papers.report import Report

__all__ = ["DEFAULT_DELTA", "Audit", "Paper", "add_budget", "add_common"]

#: The default δ of every accounting command that reports ε at a δ. One
#: value for all: the training configuration's default too (``privacy.delta``),
#: and below 1/n for the datasets up to 100,000 privacy units that dpfl's
#: presets and the papers' tables use; for more units, pass a smaller δ.
DEFAULT_DELTA = 1e-5

#: A command's handler: the parsed flags to what it computed.
Handler = Callable[[argparse.Namespace], "Report"]


@dataclasses.dataclass(frozen=True)
class Audit:
    """One ``dpfl audit NAME``: an empirical lower bound beside the upper bounds.

    Attributes
    ----------
    name : str
        The audit's name on the command line.
    summary : str
        One line for ``dpfl audit --help``.
    flags : callable
        ``flags(parser)`` adds the audit's flags.
    run : callable
        ``run(args) -> Report``.
    figure : bool
        Whether it draws a trade-off figure (``--plot FILE``); without one the
        flag is refused.
    domains : mapping
        Flags whose values this audit bounds more narrowly than every other
        command: flag destination to the fields of its domain that change
        (``{"rounds": {"high": 10_000}}``).
    """

    name: str
    summary: str
    flags: Callable[[argparse.ArgumentParser], None]
    run: Handler
    figure: bool = False
    domains: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Paper:
    """One paper (or scheme) as the command line and ``dpfl reproduce`` see it.

    Attributes
    ----------
    name : str
        The scheme's name in ``dpfl account`` and ``dpfl calibrate``.
    summary : str
        One line for their ``--help``.
    flags : callable
        ``flags(parser, calibrate)`` adds the scheme's flags (``calibrate``:
        the target replaces the noise).
    account : callable
        ``account(args) -> Report``: the guarantee, every analysis side by side.
    calibrate : callable
        ``calibrate(args) -> Report``: the noise for a target, per analysis.
    analyses : callable
        ``analyses() -> [(name, status), ...]``: every analysis the tables
        show, the accountant's and the paper's own formulas, for ``--help``.
    audits : tuple of Audit
        Its ``dpfl audit`` commands.
    reproduction : Reproduction or None
        Its tables, figures and experiment for ``dpfl reproduce``.
    """

    name: str
    summary: str
    flags: Callable[[argparse.ArgumentParser, bool], None]
    account: Handler
    calibrate: Handler
    analyses: Callable[[], list[tuple[str, str]]]
    audits: tuple[Audit, ...] = ()
    reproduction: Reproduction | None = None


def add_budget(
    p: argparse.ArgumentParser,
    calibrate: bool,
    *,
    default_delta: float = DEFAULT_DELTA,
    delta_only: bool = False,
) -> None:
    """Target flags: calibrate needs both; account reports ε at δ or δ at ε.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The scheme's parser.
    calibrate : bool
        Whether the command is ``dpfl calibrate`` (``--epsilon`` and
        ``--delta`` required).
    default_delta : float
        The δ at which ``dpfl account`` reports ε unless told otherwise.
    delta_only : bool
        ``dpfl account`` reports ε at a δ only (no ``--epsilon``).
    """
    if calibrate:
        p.add_argument("--epsilon", type=float, required=True, help="target epsilon")
        p.add_argument(
            "--delta",
            type=float,
            required=True,
            help="target delta (well below 1/n for n privacy units)",
        )
        return
    why = "; one default for every command, below 1/n up to n = 100,000 units"
    if delta_only:
        p.add_argument(
            "--delta",
            type=float,
            default=default_delta,
            help=f"report epsilon at this delta (default {default_delta:g}{why})",
        )
        return
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--delta",
        type=float,
        help=f"report epsilon at this delta (default {default_delta:g}{why})",
    )
    g.add_argument("--epsilon", type=float, help="report delta at this epsilon")
    p.set_defaults(default_delta=default_delta)


def add_common(p: argparse.ArgumentParser, *, plot: bool) -> None:
    """``--json``, and ``--plot`` where there are curves (``dpfl account``).

    Parameters
    ----------
    p : argparse.ArgumentParser
        The command's parser.
    plot : bool
        Whether the command draws curves.
    """
    p.add_argument(
        "--json",
        action="store_true",
        help='print JSON for scripts (strict: an infinite value is the string "inf")',
    )
    if plot:
        p.add_argument(
            "--plot",
            metavar="FILE",
            help="also draw epsilon against delta and against rounds, one line per "
            "analysis, to FILE (a .png also gets a .pdf and a .svg beside it)",
        )
