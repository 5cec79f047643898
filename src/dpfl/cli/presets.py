"""``dpfl presets list|show NAME|copy NAME DIR``: the configurations dpfl ships.

The presets are package data (they come with the wheel), so every command
that takes a configuration (``train``, ``sweep``) takes a preset's name too,
and ``dpfl reproduce`` finds them wherever dpfl is installed. ``copy`` writes
one beside your own files, to edit.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

__all__ = ["add_subcommands", "preset_header"]


def preset_header(path: Path) -> str:
    """The first line of a preset's header comment (what it reproduces)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.lstrip("#").strip()
        if line.startswith("#") and text:
            return text
    return ""


def _list(args: argparse.Namespace) -> int:
    from dpfl.experiments.presets import find_preset, list_presets

    names = list_presets()
    width = max((len(n) for n in names), default=0)
    for name in names:
        print(f"{name:<{width}}  {preset_header(find_preset(name))}")
    return 0


def _show(args: argparse.Namespace) -> int:
    from dpfl.experiments.presets import find_preset

    print(find_preset(args.name).read_text(encoding="utf-8"), end="")
    return 0


def _copy(args: argparse.Namespace) -> int:
    from dpfl.errors import DpflError
    from dpfl.experiments.presets import find_preset

    source = find_preset(args.name)
    folder = Path(args.dir)
    if folder.exists() and not folder.is_dir():
        raise DpflError(f"dir must be a folder; {args.dir!r} is a file")
    target = folder / source.name
    if target.exists() and not args.force:
        raise DpflError(
            f"{target} exists; pass --force to overwrite it (or choose another dir)"
        )
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    print(f"wrote {target}; run it with: dpfl train {target}")
    return 0


def add_subcommands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Register ``presets`` with ``list``, ``show`` and ``copy``.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The top-level parser's sub-commands. Each action's parser gets its
        handler as the ``handler`` default (it returns the exit status).
    """
    from dpfl.cli.flags import Parser

    p = subparsers.add_parser(
        "presets",
        help="list, show or copy the configurations dpfl ships",
        description="The presets: one run configuration per paper and scale, "
        "shipped with dpfl. train and sweep take a preset's name in place of a "
        "file (dpfl train dp-fedavg-digits).",
    )
    actions = p.add_subparsers(dest="action", required=True, parser_class=Parser)
    a = actions.add_parser("list", help="every preset, with what it reproduces")
    a.set_defaults(handler=_list)
    a = actions.add_parser("show", help="print a preset's YAML")
    a.add_argument("name", help="the preset's name (dpfl presets list)")
    a.set_defaults(handler=_show)
    a = actions.add_parser("copy", help="copy a preset into a folder, to edit")
    a.add_argument("name", help="the preset's name (dpfl presets list)")
    a.add_argument("dir", help="the folder to write NAME.yaml into (made if missing)")
    a.add_argument("--force", action="store_true", help="overwrite NAME.yaml there")
    a.set_defaults(handler=_copy)
