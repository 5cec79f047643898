"""``dpfl audit NAME``: an empirical lower bound on ε beside the upper bounds.

The audits, their flags and their handlers are the papers'
(:func:`dpfl.papers.audits`); this module only registers them.
"""

from __future__ import annotations

import argparse

from dpfl.cli.flags import Parser, drop_option, narrow

__all__ = ["add_subcommands"]


def add_subcommands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Register ``audit``, with every paper's audits.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The top-level parser's sub-commands.
    """
    from dpfl.papers import audits

    ap = subparsers.add_parser(
        "audit",
        help="attack a mechanism: an empirical lower bound on epsilon beside the "
        "upper bounds",
    )
    names = ap.add_subparsers(dest="scheme", required=True, parser_class=Parser)
    for audit in audits():
        sp = names.add_parser(audit.name, help=audit.summary)
        audit.flags(sp)
        if not audit.figure:
            drop_option(sp, "--plot")  # no trade-off figure: refuse the flag
        for dest, changes in audit.domains.items():
            narrow(sp, dest, **changes)
        sp.set_defaults(handler=audit.run)
