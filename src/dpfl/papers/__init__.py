"""Every paper dpfl implements, one module each, and the one list of them.

A paper module holds everything the paper adds at the front of dpfl: its
flags and the event they describe, its ``dpfl account`` and ``dpfl
calibrate`` handlers (which price that event with the same
:class:`~dpfl.accounting.accountant.Accountant` a run's ledger uses, beside
the paper's own formulas, labelled with their status), its ``dpfl audit``
commands, and its tables, figures and experiment for ``dpfl reproduce``. It
registers all of it as one :class:`~dpfl.papers.base.Paper`.

:data:`PAPERS` lists them; the command line reads its schemes, audits and
reproductions from it, in its order. Adding a paper is one new module and one
entry here.

Modules: :mod:`~dpfl.papers.dsgd_rp` (random participation),
:mod:`~dpfl.papers.prifedsync` (federated f-DP), :mod:`~dpfl.papers.dp_fedavg`
(client-level DP-FedAvg), :mod:`~dpfl.papers.ms_pafl`,
:mod:`~dpfl.papers.locks`, :mod:`~dpfl.papers.gaussian` (one Gaussian
mechanism) and :mod:`~dpfl.papers.dp_sgd` (record-level DP-SGD);
:mod:`~dpfl.papers.report` (the output and the account/calibrate
drivers) and :mod:`~dpfl.papers.audits` (the audit drivers) serve them all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpfl.errors import DpflError
from dpfl.experiments.reproduce import Reproduction, write_report
from dpfl.papers import (
    dp_fedavg,
    dp_sgd,
    dsgd_rp,
    gaussian,
    locks,
    ms_pafl,
    prifedsync,
)
from dpfl.papers.base import Audit, Paper

__all__ = [
    "PAPERS",
    "REPRODUCTIONS",
    "Audit",
    "Paper",
    "audits",
    "check_reproduction",
    "reproduce",
]

#: Every paper, in the order ``dpfl account --help`` lists them.
PAPERS: tuple[Paper, ...] = (
    dsgd_rp.PAPER,
    prifedsync.PAPER,
    dp_fedavg.PAPER,
    ms_pafl.PAPER,
    locks.PAPER,
    gaussian.PAPER,
    dp_sgd.PAPER,
)

#: The papers ``dpfl reproduce`` knows, by name (read from :data:`PAPERS`).
REPRODUCTIONS: dict[str, Reproduction] = {
    p.reproduction.key: p.reproduction for p in PAPERS if p.reproduction is not None
}


def audits() -> tuple[Audit, ...]:
    """Every ``dpfl audit`` command, paper by paper."""
    return tuple(a for p in PAPERS for a in p.audits)


def _reproduction(paper: str) -> Reproduction:
    """The reproduction named ``paper`` (its key or an alias)."""
    for spec in REPRODUCTIONS.values():
        if paper == spec.key or paper in spec.aliases:
            return spec
    raise DpflError(
        f"unknown paper {paper!r}; choose from {', '.join(sorted(REPRODUCTIONS))} "
        "or all"
    )


def reproduce(paper: str, **options: Any) -> Path:
    """Write ``paper``'s reproduction report; return its path.

    Parameters
    ----------
    paper : str
        A key of :data:`REPRODUCTIONS` or one of its aliases (the scheme's or
        the algorithm's name, e.g. ``"prifedsync"``).
    **options
        :func:`dpfl.experiments.reproduce.write_report`'s options
        (``out_dir``, ``scale``, ``experiment``, ``seeds``, ``jobs``).

    Returns
    -------
    Path
        The report.

    Raises
    ------
    DpflError
        If the paper is unknown.
    """
    return write_report(_reproduction(paper), **options)


def check_reproduction(paper: str, scale: str) -> str:
    """Check ``paper``'s experiment at ``scale`` without running it.

    Every variant's configuration of every experiment at the scale (its
    preset with the scale's and the variant's overrides) is read and
    validated, as ``dpfl train --check`` reads one: keys, types, ranges and
    the privacy settings. Nothing is written and no data is read.

    Parameters
    ----------
    paper : str
        As for :func:`reproduce`.
    scale : str
        One of :data:`dpfl.experiments.reproduce.SCALES`.

    Returns
    -------
    str
        One line: each experiment's preset, variants and seeds.

    Raises
    ------
    DpflError
        If the paper is unknown, its preset missing, or a variant invalid.
    """
    from dpfl.experiments.config import load_config
    from dpfl.experiments.presets import find_preset

    spec = _reproduction(paper)
    lines = []
    for exp in spec.experiments(scale):
        preset = find_preset(exp.preset)
        grid = (
            [()] if exp.tune is None else [(f"{exp.tune[0]}={v}",) for v in exp.tune[1]]
        )
        for _, overrides in exp.variants:
            for tuned in grid:  # every value of the tuning grid, too
                load_config(preset, [*exp.overrides, *overrides, *tuned])
        labels = ", ".join(label for label, _ in exp.variants)
        lines.append(
            f"preset {exp.preset} ({preset}), {len(exp.variants)} variants "
            f"({labels}) x {exp.seeds} seeds"
        )
    return "valid: " + "; ".join(lines) + f" at scale {scale}"
