"""Snapshot ``dpfl account``/``calibrate``/``audit`` JSON for every scheme, and compare.

Usage::

    python tools/account_snapshot.py OUT.json            # run every case, save
    python tools/account_snapshot.py --compare OLD NEW   # what moved, and by how much
    python tools/account_snapshot.py --help-texts OUT.txt  # every parser's --help

Each case is one command line with ``--json`` (every ``--analysis`` a scheme
offers, since ``--json`` reports only the chosen one; both directions, ε at δ
and δ at ε, where a scheme has both). The snapshot maps the command line to
its parsed JSON (or to its exit status and error line). ``--compare`` lists
keys that appeared or vanished, strings that changed, and every number whose
relative change exceeds 1e-12, with the bracket the old output stated
(``epsilon_lower``/``delta_lower``) where it had one: a change of road should
move a number only inside that bracket or within the accountant's tolerance.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
import time
from typing import Any


def _main_function() -> Any:
    try:  # the package layout
        from dpfl.cli.main import main
    except ImportError:  # the single-module layout
        from dpfl.cli import main  # type: ignore[no-redef]
    return main


RP = ["--p", "0.001", "--q", "0.1", "--records-per-client", "30"]
RP2 = ["--p", "0.1", "--q", "0.5", "--records-per-client", "3"]
PFS = ["--batch-size", "16", "--records-per-client", "600", "--local-steps", "38"]
PFS_SMALL = ["--batch-size", "16", "--records-per-client", "600", "--local-steps", "5"]
LOCKS = ["--q1", "0.1", "--norm-noise-ratio", "3.3333"]


def cases() -> list[list[str]]:
    """Every command line of the snapshot (without ``--json``)."""
    out: list[list[str]] = []
    rp = ("sound", "wcs", "ols", "paper", "cs")
    for a in rp:
        sig = ["--noise-multiplier", "2.5"]
        out.append(["account", "random-participation", *RP, *sig, "--analysis", a])
        out.append(
            ["account", "random-participation", *RP, *sig, "--epsilon", "0.02"]
            + ["--analysis", a]
        )
        out.append(
            ["account", "random-participation", *RP, *sig, "--rounds", "100"]
            + ["--delta", "1e-6", "--analysis", a]
        )
        out.append(
            ["account", "random-participation", *RP2, "--noise-multiplier", "2"]
            + ["--rounds", "20", "--epsilon", "1", "--analysis", a]
        )
        out.append(
            ["calibrate", "random-participation", *RP, "--epsilon", "0.015"]
            + ["--delta", "1e-6", "--analysis", a]
        )
        out.append(
            ["calibrate", "random-participation", *RP2, "--rounds", "10"]
            + ["--epsilon", "2", "--delta", "1e-5", "--analysis", a]
        )
    for a in ("exact", "clt"):
        base = ["--noise-multiplier", "1.0", *PFS, "--rounds", "93"]
        out.append(["account", "prifedsync", *base, "--analysis", a])
        out.append(
            ["account", "prifedsync", *base, "--analysis", a, "--guarantee", "strong"]
            + ["--num-clients", "100", "--sync-probability", "0.5"]
        )
        out.append(
            ["calibrate", "prifedsync", *PFS_SMALL, "--rounds", "10"]
            + ["--epsilon", "2", "--delta", "1e-5", "--analysis", a]
        )
    fedavg = ("sound", "sound-rdp", "paper", "paper-rdp", "paper-pld")
    for a in fedavg:
        k = ["--clients", "100", "--cohort", "10"]
        out.append(
            ["account", "dp-fedavg", *k, "--rounds", "50", "--noise-multiplier"]
            + ["1.1", "--analysis", a]
        )
        out.append(
            ["account", "dp-fedavg", *k, "--rounds", "50", "--noise-multiplier"]
            + ["1.1", "--epsilon", "2", "--threshold", "0.001", "--analysis", a]
        )
        out.append(
            ["calibrate", "dp-fedavg", "--clients", "100", "--cohort", "50"]
            + ["--rounds", "11", "--epsilon", "8", "--delta", "1e-3", "--analysis", a]
        )
    for a in ("sound", "paper", "central", "local", "global"):
        out.append(["account", "ms-pafl", "--analysis", a])
        out.append(
            ["account", "ms-pafl", "--noise-multiplier", "2", "--rounds", "30"]
            + ["--rounds-joined", "12", "--replacement", "--analysis", a]
        )
    for a in ("sound", "paper"):
        out.append(
            ["calibrate", "ms-pafl", "--rounds", "30", "--epsilon", "3"]
            + ["--delta", "1e-5", "--analysis", a]
        )
    for a in ("server", "observer"):
        base = ["--noise-multiplier", "1.5", "--rounds", "100"]
        out.append(["account", "locks", *LOCKS, *base, "--analysis", a])
        out.append(
            ["account", "locks", *LOCKS, *base, "--max-p2", "0.5"]
            + ["--norm-rounds", "20", "--update-rounds", "7", "--analysis", a]
        )
        out.append(
            ["calibrate", "locks", *LOCKS, "--rounds", "100", "--epsilon", "4"]
            + ["--delta", "1e-5", "--analysis", a]
        )
    for a in ("exact", "classic"):
        out.append(["account", "gaussian", "--noise-multiplier", "2", "--analysis", a])
        out.append(
            ["account", "gaussian", "--noise-multiplier", "0.8", "--sensitivity", "2"]
            + ["--epsilon", "1", "--analysis", a]
        )
        out.append(
            ["calibrate", "gaussian", "--epsilon", "0.5", "--delta", "1e-5"]
            + ["--analysis", a]
        )
        out.append(
            ["calibrate", "gaussian", "--epsilon", "3", "--delta", "1e-6"]
            + ["--sensitivity", "2", "--analysis", a]
        )
    out.append(
        ["audit", "gaussian", "--noise-multiplier", "1", "--trials", "2000"]
        + ["--delta", "1e-5"]
    )
    out.append(
        ["audit", "random-participation", *RP2, "--noise-multiplier", "1"]
        + ["--trials", "2000", "--analysis", "wcs"]
    )
    return out


def run_case(main: Any, argv: list[str]) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main([*argv, "--json"])
        except SystemExit as exc:
            status = exc.code
    seconds = time.perf_counter() - t0
    if status == 0:
        return {"json": json.loads(out.getvalue()), "seconds": seconds}
    return {"status": status, "error": err.getvalue().strip(), "seconds": seconds}


def snapshot(path: str, only: str | None) -> None:
    main = _main_function()
    result: dict[str, Any] = {}
    for argv in cases():
        key = " ".join(argv)
        if only and only not in key:
            continue
        result[key] = run_case(main, argv)
        print(f"{result[key]['seconds']:7.2f} s  {key}", flush=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)


def _build_parser() -> Any:
    try:
        from dpfl.cli.main import build_parser
    except ImportError:
        from dpfl.cli import build_parser  # type: ignore[no-redef]
    return build_parser()


def help_texts(path: str) -> None:
    """Every parser's help and one table per scheme, to compare as text."""
    import argparse as ap
    import os

    os.environ["COLUMNS"] = "100"
    parts: list[str] = []

    def visit(parser: Any, name: str) -> None:
        parts.append(f"=== {name}\n{parser.format_help()}")
        for action in parser._actions:
            if isinstance(action, ap._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    visit(sub, f"{name} {sub_name}")

    visit(_build_parser(), "dpfl")
    main = _main_function()
    for argv in cases():
        if "--analysis" in argv and argv[argv.index("--analysis") + 1] not in (
            "sound",
            "exact",
            "server",
        ):
            continue
        if argv[0] == "calibrate" and argv[1] in ("prifedsync", "random-participation"):
            continue  # slow (the table calibrates every analysis)
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                main(argv)
            except SystemExit:
                pass
        parts.append(f"=== {' '.join(argv)}\n{out.getvalue()}")
        print(" ".join(argv), flush=True)
    with open(path, "w") as f:
        f.write("\n".join(parts))


def _walk(x: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(x, dict):
        out: dict[str, Any] = {}
        for k, v in x.items():
            out.update(_walk(v, f"{prefix}.{k}" if prefix else k))
        return out
    if isinstance(x, list):
        out = {}
        for i, v in enumerate(x):
            out.update(_walk(v, f"{prefix}[{i}]"))
        return out
    return {prefix: x}


def compare(old_path: str, new_path: str) -> int:
    with open(old_path) as f:
        old = json.load(f)
    with open(new_path) as f:
        new = json.load(f)
    changed = 0
    for key in sorted(set(old) | set(new)):
        if key not in old or key not in new:
            print(f"{key}: only in {'new' if key in new else 'old'}")
            changed += 1
            continue
        a = _walk({k: v for k, v in old[key].items() if k != "seconds"})
        b = _walk({k: v for k, v in new[key].items() if k != "seconds"})
        lines = []
        for field in sorted(set(a) | set(b)):
            if field not in a or field not in b:
                lines.append(f"  {field}: only in {'new' if field in b else 'old'}")
                continue
            x, y = a[field], b[field]
            if isinstance(x, int | float) and isinstance(y, int | float):
                if x == y or (math.isfinite(x) and abs(x - y) <= 1e-12 * abs(x)):
                    continue
                rel = abs(y - x) / abs(x) if x else math.inf
                name = field.rpartition(".")[2]
                low = a.get(field.replace(name, f"{name}_lower"))
                bracket = f", old bracket [{low:.6g}, {x:.6g}]" if low else ""
                lines.append(f"  {field}: {x!r} -> {y!r} (rel {rel:.2e}{bracket})")
            elif x != y:
                lines.append(f"  {field}: {x!r} -> {y!r}")
        if lines:
            changed += 1
            print(key)
            print("\n".join(lines))
    print(f"{changed} of {len(set(old) | set(new))} cases differ")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="snapshot file to write")
    parser.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    parser.add_argument("--only", help="run the cases containing this text")
    parser.add_argument("--help-texts", metavar="OUT", help="write every help text")
    args = parser.parse_args()
    if args.help_texts:
        help_texts(args.help_texts)
        return 0
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        parser.error("give OUT or --compare OLD NEW")
    snapshot(args.out, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
