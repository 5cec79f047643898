"""``dpfl data list`` and ``dpfl data fetch NAME``.

``list`` says, for every data set dpfl knows, whether its files are found
and where (or how to get them); ``fetch`` downloads one from its official
home, on request only (see :mod:`dpfl.data.fetch`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os

__all__ = ["add_subcommands"]

# Data sets that need no files, and how they come.
_BUILT_IN = {
    "digits": "bundled with scikit-learn (1,797 8x8 images)",
    "synthetic": "generated (FedProx's Synthetic(alpha, beta))",
    "synthetic-images": "generated (procedural 28x28 images)",
    "csv": "your file: data.path (label column, optional client column)",
    "npz": "your file: data.path (named arrays)",
    "idx": "your files: data.path (IDX images and labels, or their directory)",
}


def _list(args: argparse.Namespace) -> int:
    from dpfl.data.fetch import SOURCES, default_root
    from dpfl.data.loaders import DEBIAN_FASHION_MNIST_DIR, DatasetNotFoundError
    from dpfl.data.locate import REAL_DATASETS, locate

    root = args.root
    print("dpfl looks for a data set's files in, in order:")
    if root is not None:
        print(f"  {root} and its sub-folders (--root)")
    env = os.environ.get("DPFL_DATA")
    print(f"  $DPFL_DATA/<name>  ({'= ' + env if env else 'not set'})")
    print("  ~/.dpfl/data/<name>")
    print(f"  {DEBIAN_FASHION_MNIST_DIR}  (fashion-mnist only, Debian's package)")
    print(f"`dpfl data fetch NAME` downloads into {default_root()} (or --root).\n")
    rows = []
    for name in REAL_DATASETS:
        try:
            rows.append((name, "found", str(locate(name, root))))
        except DatasetNotFoundError:
            how = f"dpfl data fetch {name}" if name in SOURCES else "see docs"
            rows.append((name, "missing", how))
    sk = importlib.util.find_spec("sklearn") is not None
    for name, what in _BUILT_IN.items():
        status = "ready"
        if name == "digits" and not sk:
            status, what = "missing", "pip install scikit-learn"
        rows.append((name, status, what))
    width = max(len(r[0]) for r in rows)
    for name, status, what in rows:
        print(f"  {name:<{width}}  {status:<7}  {what}")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    from dpfl.data.fetch import fetch, plan

    p = plan(args.name, args.root)
    print(p.describe())
    if args.dry_run or p.present is not None:
        return 0
    where = fetch(args.name, args.root)
    root_hint = (
        "" if args.root is None else f" (pass root={args.root!r} or set DPFL_DATA)"
    )
    print(f"done: the loaders read {where}{root_hint}")
    return 0


def add_subcommands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Register ``dpfl data`` with its ``list`` and ``fetch`` subcommands.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        From ``parser.add_subparsers()``; each leaf parser gets a ``handler``
        default returning the exit status.
    """
    from dpfl.data.fetch import SOURCES

    p = subparsers.add_parser(
        "data",
        help="list the data sets dpfl finds, or download one (opt-in)",
        description="Where dpfl finds each data set's files, and an opt-in "
        "download from the data set's official home.",
    )
    sub = p.add_subparsers(dest="data_command", required=True)
    lp = sub.add_parser(
        "list",
        help="every data set, found or not, and where dpfl looks",
        description="For every data set: found (and where), missing (and how "
        "to get it), or ready (built in / generated / your own file).",
    )
    lp.add_argument("--root", default=None, help="a directory to look in first")
    lp.set_defaults(handler=_list)
    fp = sub.add_parser(
        "fetch",
        help="download a data set from its official home and verify its checksum",
        description="Download NAME from its official URLs, check each file's "
        "MD5/SHA-256, and unpack it where the loaders look. Needs network "
        "access; nothing else in dpfl downloads.",
    )
    fp.add_argument("name", choices=sorted(SOURCES), help="the data set")
    fp.add_argument(
        "--root",
        default=None,
        help="data root (default: $DPFL_DATA, else ~/.dpfl/data)",
    )
    fp.add_argument(
        "--dry-run",
        action="store_true",
        help="print the URLs, checksums and destination; download nothing",
    )
    fp.set_defaults(handler=_fetch)
