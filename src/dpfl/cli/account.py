"""``dpfl account SCHEME`` and ``dpfl calibrate SCHEME``, one scheme per paper.

``account`` prints a table with the guarantee's terms and every analysis side
by side (``--json`` for scripts, ``--plot FILE`` for ε–δ and ε–rounds
curves); ``calibrate`` finds the noise multiplier for a target (ε, δ) under
every analysis. The schemes, their flags and their handlers are the papers'
(:data:`dpfl.papers.PAPERS`); this module only registers them.
"""

from __future__ import annotations

import argparse

from dpfl.cli.flags import CALIBRATED_EPSILON, Parser, narrow

__all__ = ["add_subcommands"]

_COMMANDS = (
    ("account", "report the privacy of a scheme (every analysis side by side)"),
    ("calibrate", "find the noise multiplier for a target (epsilon, delta)"),
)


def add_subcommands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Register ``account`` and ``calibrate``, each with every paper's scheme.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The top-level parser's sub-commands. Each scheme's parser gets its
        paper's handler as the ``handler`` default.
    """
    from dpfl.papers import PAPERS

    for mode, help_text in _COMMANDS:
        mp = subparsers.add_parser(mode, help=help_text)
        schemes = mp.add_subparsers(dest="scheme", required=True, parser_class=Parser)
        for paper in PAPERS:
            sp = schemes.add_parser(
                paper.name, help=paper.summary, description=paper.summary
            )
            paper.flags(sp, mode == "calibrate")
            statuses = ", ".join(f"{n} ({st})" for n, st in paper.analyses())
            for action in sp._actions:
                if action.dest == "analysis" and action.help:
                    action.help += (
                        f"; the table shows every one: {statuses} "
                        "(proven: a valid bound; open: not known to be one; "
                        "invalid: not a worst-case bound, for comparison)"
                    )
            if mode == "calibrate":  # the ε a noise multiplier is calibrated to
                narrow(sp, "epsilon", **CALIBRATED_EPSILON)
            handler = paper.account if mode == "account" else paper.calibrate
            sp.set_defaults(handler=handler)
