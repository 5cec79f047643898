"""The ``dpfl`` command line.

``dpfl account SCHEME ...`` and ``dpfl calibrate SCHEME ...`` print a table with
the guarantee's terms and every analysis side by side (``--json`` for scripts,
``--plot FILE`` for ε–δ and ε–rounds curves). Training commands (``train``,
``resume``, ``plot``, ``demo``) load torch lazily, so the accounting commands
work without it. The JSON is strict: a non-finite number (an ε with no finite
bound) is the string ``"inf"``, ``"-inf"`` or ``"nan"``, never the
non-standard ``Infinity`` or ``NaN``.

Errors in the input exit with status 2 and one line naming the parameter (a
value it quotes is cut to a few dozen characters); every numeric flag has a
domain (:data:`FLAG_DOMAINS`), bounded where the cost of a computation grows
with the value (:data:`MAX_ROUNDS`, :data:`MAX_RECORDS`); a
missing optional dependency exits with status 1 and one line naming the extra
to install; Ctrl-C exits with status 130.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any, NoReturn

from dpfl._validate import (
    MAX_CALIBRATED_EPSILON,
    MAX_EPSILON,
    MAX_ROUNDS,
    MAX_SEED,
    MIN_DELTA,
    NOISE_RANGE,
    parse_number,
)
from dpfl.accounting._quiet import quiet as _quiet
from dpfl.errors import DpflError, InvalidParameterError

__all__ = ["main"]


#: The default δ of every accounting command that reports ε at a δ. One
#: value for all: the training configuration's default too (``privacy.delta``),
#: and below 1/n for the datasets up to 100,000 privacy units that dpfl's
#: presets and the papers' tables use; for more units, pass a smaller δ.
DEFAULT_DELTA = 1e-5

#: Exit status when an optional dependency (an extra) is not installed.
EXIT_MISSING_EXTRA = 1

#: Exit status on Ctrl-C (128 + SIGINT, the shell's convention).
EXIT_INTERRUPTED = 130


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show each option's default, unless its help already names it or it has none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        if not action.option_strings:
            return text
        return text + " (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit status 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


#: The most characters of an error line (the user's values in it are cut).
ERROR_LIMIT = 500


def one_line(message: str, limit: int = ERROR_LIMIT) -> str:
    """``message`` on one line of at most ``limit`` characters.

    Control characters (a newline in a value a user passed) are escaped, and
    a message longer than ``limit`` (one that quotes a long value) is cut in
    the middle, keeping its start and, where the whole message was read, its
    end (where dpfl's messages say what to do).

    Parameters
    ----------
    message : str
        An error message.
    limit : int
        The most characters kept.

    Returns
    -------
    str
        The message, printable and on one line.
    """
    total = len(message)
    message = re.sub(r"\s*\n\s*", " ", message[: 4 * limit])  # lines joined
    text = "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
        for c in message[: 2 * limit]
    )
    if len(text) > limit or total > 2 * limit:
        # keep the start (what failed) and the end (what to do about it)
        total = max(total, len(text))
        tail = text[-(limit // 3) :] if total <= 2 * limit else ""
        note = f" ... ({total} characters in all) ... "
        text = f"{text[: limit - len(tail) - len(note)]}{note}{tail}"
    return text


# ---------------------------------------------------------------------------
# Flag domains: every number a flag takes is checked where it is parsed
# ---------------------------------------------------------------------------
#: The most records per client (and records in a batch or data set) the
#: accounting commands accept: the per-client binomial mixtures hold d + 1
#: terms.
MAX_RECORDS = 10_000_000

#: The most clients a command accepts (ratios such as m / K stay exact).
MAX_CLIENTS = 10**9

#: The most trials an audit runs on each side of its pair.
MAX_TRIALS = 10**8

_UNIT = "(0, 1]"


@dataclasses.dataclass(frozen=True)
class _Domain:
    """The values a numeric flag accepts; ``kind`` is ``int`` or ``float``."""

    kind: type
    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    why: str = ""

    def describe(self) -> str:
        if self.kind is int:
            return f"an integer in [{int(self.low)}, {int(self.high)}]{self.why}"
        lo = "(" if self.low_open else "["
        hi = ")" if self.high_open else "]"
        return f"a number in {lo}{self.low:g}, {self.high:g}{hi}{self.why}"

    def __call__(self, text: str) -> Any:
        from dpfl._validate import shown

        bad = argparse.ArgumentTypeError(
            f"must be {self.describe()}; got {shown(text)}"
        )
        try:  # the one spelling of a number (dpfl._validate.parse_number)
            value: Any = parse_number(text, integer=self.kind is int)
        except ValueError:
            raise bad from None
        if self.kind is float:
            value = float(value)
        if math.isnan(value):
            raise bad
        low_ok = value > self.low if self.low_open else value >= self.low
        high_ok = value < self.high if self.high_open else value <= self.high
        if not (low_ok and high_ok):
            raise bad
        return value


def _ints(low: int, high: int, why: str = "") -> _Domain:
    return _Domain(int, low, high, why=why)


_PROBABILITY = _Domain(float, 0.0, 1.0, low_open=True)
_OPEN_UNIT = _Domain(float, 0.0, 1.0, low_open=True, high_open=True)
_DELTA = _Domain(
    float,
    MIN_DELTA,
    1.0,
    high_open=True,
    why=" (below 1e-15 the accounting's double-precision rounding exceeds delta)",
)
_POSITIVE = _Domain(float, 0.0, math.inf, low_open=True, high_open=True)
_EPSILON = _Domain(
    float, 0.0, MAX_EPSILON, low_open=True, why=" (e^epsilon must stay finite)"
)
_CALIBRATED_EPSILON = _Domain(
    float,
    0.0,
    MAX_CALIBRATED_EPSILON,
    low_open=True,
    why=" (no guarantee is left past it, and the noise it allows is too small "
    "to price in bounded time)",
)
_ROUNDS = _ints(1, MAX_ROUNDS, " (the range the accounting answers in bounded time)")
_RECORDS = _ints(1, MAX_RECORDS, " (the accounting's memory grows with it)")
_NOISE = _Domain(
    float,
    *NOISE_RANGE,
    why=" (below, the privacy loss overflows; above, every epsilon is 0)",
)

#: The domain of each numeric flag, by its destination; a command may
#: override one (:data:`FLAG_DOMAINS_BY_COMMAND`). Every ``type=int`` or
#: ``type=float`` flag must have one (a test checks).
FLAG_DOMAINS: dict[str, _Domain] = {
    "p": _PROBABILITY,
    "q": _PROBABILITY,
    "q1": _PROBABILITY,
    "max_p2": _PROBABILITY,
    "probability": _PROBABILITY,
    "sync_probability": _PROBABILITY,
    "participation": _PROBABILITY,
    "delta": _DELTA,
    "local_delta": _DELTA,
    "confidence": _OPEN_UNIT,
    "threshold": _DELTA,
    "epsilon": _EPSILON,
    "local_epsilon": _EPSILON,
    "noise_multiplier": _NOISE,
    "sensitivity": _POSITIVE,
    "norm_noise_ratio": _POSITIVE,
    "xi": _POSITIVE,
    "clip": _POSITIVE,
    "angle": _Domain(float, 0.0, 180.0, why=" degrees"),
    "rounds": _ROUNDS,
    "local_steps": _ROUNDS,
    "rounds_joined": _ints(0, MAX_ROUNDS),
    "norm_rounds": _ints(0, MAX_ROUNDS),
    "update_rounds": _ints(0, MAX_ROUNDS),
    "records_per_client": _RECORDS,
    "batch_size": _RECORDS,
    "dataset_size": _RECORDS,
    "clients": _ints(1, MAX_CLIENTS),
    "num_clients": _ints(1, MAX_CLIENTS),
    "cohort": _ints(1, MAX_CLIENTS),
    "trials": _ints(1, MAX_TRIALS, " (an audit's time grows with it)"),
    "seed": _ints(0, MAX_SEED),
    "seeds": _ints(1, 1_000),
    "jobs": _ints(1, 1_024),
    "canaries": _ints(1, 100_000),
    "runs": _ints(1, 1_000),
    "hidden": _ints(1, 100_000),
}

#: Per-command overrides of :data:`FLAG_DOMAINS` (``prog`` suffix -> dest; a
#: command's first word covers all its schemes, e.g. ``"calibrate"``).
FLAG_DOMAINS_BY_COMMAND: dict[str, dict[str, _Domain]] = {
    # the training audits run real rounds on the digits (1,347 records)
    "audit dp-fedavg": {
        "clients": _ints(1, 1_347, " (the digits' training records)"),
        "rounds": _ints(1, 10_000),
        "noise_multiplier": _Domain(float, 0.0, 1e6, low_open=True),
    },
    "audit dp-dsgd": {
        "clients": _ints(1, 1_347, " (the digits' training records)"),
        "rounds": _ints(1, 10_000),
        "noise_multiplier": _Domain(float, 0.0, 1e6, low_open=True),
    },
    # the demo trains four runs of --rounds rounds each
    "demo": {"rounds": _ints(1, 10_000)},
    # every `calibrate SCHEME`: the ε a noise multiplier is calibrated to
    "calibrate": {"epsilon": _CALIBRATED_EPSILON},
}


def _check_flags(parser: argparse.ArgumentParser) -> None:
    """Give every numeric flag of ``parser`` and its sub-parsers its domain."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _check_flags(sub)
            continue
        if action.type not in (int, float):
            continue
        command = parser.prog.partition(" ")[2]
        domain = FLAG_DOMAINS_BY_COMMAND.get(command, {}).get(action.dest)
        group = FLAG_DOMAINS_BY_COMMAND.get(command.partition(" ")[0], {})
        domain = domain or group.get(action.dest) or FLAG_DOMAINS.get(action.dest)
        if domain is None or domain.kind is not action.type:
            raise TypeError(  # a programming error: a new flag without a domain
                f"flag {action.option_strings} of {parser.prog!r} has no domain"
            )
        action.type = domain
        action.metavar = action.metavar or action.dest.upper()
        if domain.why and action.help and domain.high < math.inf:
            action.help += f"; {domain.describe()}"


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------
class Report:
    """What a sub-command computed: the chosen result and a side-by-side table."""

    def __init__(
        self,
        title: str,
        result: dict[str, Any],
        rows: list[dict[str, Any]] | None = None,
        notes: Sequence[str] = (),
        plot: Callable[[str], None] | None = None,
    ) -> None:
        self.title = title
        self.result = result
        self.rows = rows or []
        self.notes = list(notes)
        self.plot = plot

    def to_json(self, inputs: dict[str, Any] | None = None) -> str:
        """The chosen result as JSON; ``inputs`` (the command's options) echoed."""
        out = dict(self.result)
        if self.notes:
            out.setdefault("notes", self.notes)
        if inputs:
            out.setdefault("inputs", inputs)
        return json.dumps(strict_json(out), indent=2, allow_nan=False)

    def to_table(self) -> str:
        lines = [self.title, ""]
        # terms shared by every row are printed once, above the table
        shared = {
            key
            for key in ("unit", "neighbouring", "adversary")
            if key in self.result
            and all(r.get(key, self.result[key]) == self.result[key] for r in self.rows)
        }
        for key in ("unit", "neighbouring", "adversary"):
            if key in shared:
                lines.append(f"  {key:<13}{self.result[key]}")
        if self.rows:
            cols = [
                c
                for c in dict.fromkeys(k for r in self.rows for k in r)
                if c not in shared
            ]
            cols.sort(
                key=lambda c: (c != "analysis", c in ("neighbouring", "adversary"))
            )
            cells = [[_fmt(r.get(c, "")) for c in cols] for r in self.rows]
            widths = [
                max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)
            ]
            lines.append("")
            lines.append(
                "  " + "  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()
            )
            lines.append("  " + "  ".join("-" * w for w in widths))
            for row in cells:
                lines.append(
                    "  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()
                )
        if self.notes:
            lines.append("")
            lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def strict_json(x: Any) -> Any:
    """``x`` as plain JSON data: no NaN or infinity, which JSON does not have.

    A non-finite number becomes the string ``"inf"``, ``"-inf"`` or
    ``"nan"`` (an ε of ``"inf"``: no finite guarantee); numpy scalars and
    arrays become Python numbers and lists; tuples become lists.

    Parameters
    ----------
    x : Any
        A result: dicts, lists, numbers, strings, None, numpy values.

    Returns
    -------
    Any
        Data that ``json.dumps(..., allow_nan=False)`` accepts.
    """
    if isinstance(x, Mapping):
        return {str(k): strict_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [strict_json(v) for v in x]
    if hasattr(x, "tolist"):  # numpy scalar or array
        return strict_json(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if x is None or isinstance(x, str | int | float):
        return x
    raise TypeError(f"not JSON serialisable: {x!r}")


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isinf(v) or math.isnan(v):
            return str(v)
        if v == 0 or 1e-3 <= abs(v) < 1e5:
            return f"{v:.5g}"
        return f"{v:.4e}"
    return str(v)


# ---------------------------------------------------------------------------
# Schemes
# ---------------------------------------------------------------------------
def _add_budget(
    p: argparse.ArgumentParser,
    calibrate: bool,
    *,
    default_delta: float,
    delta_only: bool = False,
) -> None:
    """Target flags: calibrate needs both; account reports ε at δ or δ at ε."""
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


def _add_common(p: argparse.ArgumentParser, *, plot: bool) -> None:
    """``--json``, and ``--plot`` where there are curves (``dpfl account``)."""
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


# -- shared pieces --------------------------------------------------------------
def _terms(event: Any, analysis: str | None) -> dict[str, Any]:
    """The guarantee's terms and the analysis's status, for JSON and tables."""
    from dpfl.accounting import schemes

    d = schemes.describe(event, analysis)
    return {
        k: d[k] for k in ("unit", "neighbouring", "adversary", "analysis", "status")
    }


def _formula(key: str) -> dict[str, Any]:
    """Status row fields of a paper formula (see ``schemes.FORMULAS``)."""
    from dpfl.accounting import schemes

    a = schemes.FORMULAS[key]
    out: dict[str, Any] = {"analysis": a.name, "status": a.status}
    if a.adversary:
        out["adversary"] = a.adversary
    return out


def _basis_notes(event: Any, names: Sequence[str]) -> list[str]:
    """One note per analysis shown: its status and what it rests on."""
    from dpfl.accounting import schemes

    scheme = schemes.scheme_of(event)
    out = []
    for name in names:
        a = scheme.analysis(name)
        out.append(f"{a.name} ({a.status}): {a.basis}")
    return out


def _accountant_epsilon(
    event: Any, rounds: int, delta: float, analysis: str | None
) -> dict[str, float]:
    from dpfl.accounting.accountant import Accountant

    b = Accountant(analysis).compose(event, rounds).epsilon(delta)
    return {"epsilon": b.upper, "epsilon_lower": b.lower, "delta": delta}


def _accountant_delta(
    event: Any, rounds: int, epsilon: float, analysis: str | None
) -> dict[str, float]:
    from dpfl.accounting.accountant import Accountant

    b = Accountant(analysis).compose(event, rounds).delta(epsilon)
    return {"delta": b.upper, "delta_lower": b.lower, "epsilon": epsilon}


def _solve(
    epsilon_of: Callable[[float], float], target: float, what: str
) -> tuple[float | None, dict[str, Any], str | None]:
    """σ for a target, or (None, flag, note) when the analysis certifies any σ."""
    from dpfl.accounting.calibrate import CertifiesEverySigma, solve_noise_multiplier

    try:
        return solve_noise_multiplier(epsilon_of, epsilon=target, what=what), {}, None
    except CertifiesEverySigma as exc:
        return None, {"certifies_every_sigma": True}, str(exc)


def _calibrated(
    a: argparse.Namespace,
    title: str,
    names: Sequence[str],
    epsilon_of: Callable[[str, float], float],
    describe: Callable[[str], dict[str, Any]],
    notes: Sequence[str] = (),
    **extra: Callable[[float], float],
) -> Report:
    """One calibration report: σ per analysis by the one calibrator.

    ``epsilon_of(analysis, sigma)`` is the certified ε; ``describe(analysis)``
    gives the row's terms and status; each ``extra`` column is a function of σ.
    """
    rows: list[dict[str, Any]] = []
    found: list[str] = []
    for name in [a.analysis] if a.json else names:
        sigma, flag, note = _solve(
            functools.partial(epsilon_of, name),
            a.epsilon,
            f"(epsilon={a.epsilon}, delta={a.delta}) after {a.rounds} round(s) under "
            f"{name!r}",
        )
        if note:
            found.append(note)
        row = {"noise_multiplier": sigma, **flag, **describe(name)}
        row.update({k: None if sigma is None else f(sigma) for k, f in extra.items()})
        rows.append(row)
    result = {
        **_pick(rows, a.analysis),
        "analysis": a.analysis,
        "epsilon": a.epsilon,
        "delta": a.delta,
        "rounds": a.rounds,
    }
    return Report(title, result, rows, [*found, *notes])


def _pick(rows: list[dict[str, Any]], analysis: str) -> dict[str, Any]:
    for row in rows:
        if row["analysis"] == analysis:
            return {k: v for k, v in row.items() if k != "analysis"}
    raise DpflError(f"no analysis {analysis!r} among {[r['analysis'] for r in rows]}")


# -- random participation ------------------------------------------------------
def _rp_args(p: argparse.ArgumentParser, calibrate: bool) -> None:
    from dpfl.accounting import participation as rp

    p.add_argument(
        "--p", type=float, required=True, help="client participation probability"
    )
    p.add_argument("--q", type=float, required=True, help="record sampling probability")
    p.add_argument(
        "--records-per-client", type=int, required=True, help="d, records per client"
    )
    p.add_argument("--rounds", type=int, default=1, help="rounds T (default 1)")
    if not calibrate:
        p.add_argument(
            "--noise-multiplier",
            type=float,
            required=True,
            help="noise std on the sum of gradients clipped to C, divided by C",
        )
    p.add_argument(
        "--analysis",
        default=rp.ANALYSES[0],
        choices=rp.ANALYSES,
        help=f"the analysis --json reports (default {rp.ANALYSES[0]}, the tightest "
        "proven)",
    )
    _add_budget(p, calibrate, default_delta=DEFAULT_DELTA)
    _add_common(p, plot=not calibrate)


def _rp_event(a: argparse.Namespace, sigma: float) -> Any:
    from dpfl.accounting import events as ev

    return ev.ClientPoisson(
        a.p, ev.RecordPoisson(a.q, a.records_per_client, ev.Gaussian(sigma))
    )


def _rp_kw(a: argparse.Namespace, sigma: float, analysis: str) -> dict[str, Any]:
    return {
        "participation_probability": a.p,
        "record_probability": a.q,
        "records_per_client": a.records_per_client,
        "noise_multiplier": sigma,
        "analysis": analysis,
    }


def _rp_epsilon(
    a: argparse.Namespace,
    sigma: float,
    analysis: str,
    delta: float,
    resolution: float = 0.0,
) -> float:
    from dpfl.accounting import participation as rp

    kw = _rp_kw(a, sigma, analysis)
    if a.rounds == 1:
        return rp.round_epsilon(delta, **kw)
    return rp.epsilon(delta, rounds=a.rounds, resolution=resolution, **kw).upper


def account_random_participation(a: argparse.Namespace) -> Report:
    from dpfl.accounting import participation as rp

    rows = []
    for name in [a.analysis] if a.json else list(rp.ANALYSES):
        kw = _rp_kw(a, a.noise_multiplier, name)
        if a.epsilon is not None:
            if a.rounds == 1:
                value = {"delta": rp.round_delta(a.epsilon, **kw), "epsilon": a.epsilon}
            else:
                b = rp.delta(a.epsilon, rounds=a.rounds, **kw)
                value = {"delta": b.upper, "delta_lower": b.lower, "epsilon": a.epsilon}
        elif a.rounds == 1:
            value = {"epsilon": rp.round_epsilon(a.delta, **kw), "delta": a.delta}
        else:
            b = rp.epsilon(a.delta, rounds=a.rounds, **kw)
            value = {"epsilon": b.upper, "epsilon_lower": b.lower, "delta": a.delta}
        event = _rp_event(a, a.noise_multiplier)
        rows.append({**value, **_terms(event, name)})
    event = _rp_event(a, a.noise_multiplier)
    result = {**_pick(rows, a.analysis), "analysis": a.analysis, "rounds": a.rounds}
    title = (
        f"Random participation: p={a.p}, q={a.q}, d={a.records_per_client}, "
        f"noise multiplier={a.noise_multiplier}, rounds={a.rounds}"
    )

    def plot(path: str) -> None:
        _plot_curves(
            path,
            event,
            rows,
            delta=a.delta or a.default_delta,
            rounds=a.rounds,
            title=f"Random participation: p={a.p}, q={a.q}, "
            f"d={a.records_per_client}, σ={a.noise_multiplier}",
        )

    return Report(
        title, result, rows, _basis_notes(event, [r["analysis"] for r in rows]), plot
    )


def calibrate_random_participation(a: argparse.Namespace) -> Report:
    from dpfl.accounting import participation as rp

    event = _rp_event(a, 1.0)
    title = (
        f"Noise for (epsilon={a.epsilon}, delta={a.delta}) after {a.rounds} round(s) "
        f"of random participation: p={a.p}, q={a.q}, d={a.records_per_client}"
    )
    names = [a.analysis] if a.json else list(rp.ANALYSES)
    return _calibrated(
        a,
        title,
        rp.ANALYSES,
        # only "is epsilon below the target?" matters (see Accountant.resolution)
        lambda name, sigma: _rp_epsilon(a, sigma, name, a.delta, 1e-3 * a.epsilon),
        lambda name: _terms(event, name),
        _basis_notes(event, names),
    )


def _with(a: argparse.Namespace, **changes: Any) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(a), **changes})


def _plot_curves(
    path: str,
    event: Any,
    rows: Sequence[Mapping[str, Any]],
    epsilon: Callable[[str, Sequence[float], int], list[float]] | None = None,
    *,
    delta: float,
    rounds: int | None,
    title: str,
) -> None:
    """Draw ε vs δ (at ``rounds``) and ε vs rounds (at ``delta``) per analysis.

    One line per table row (its ``analysis`` and ``status``).
    ``epsilon(analysis, deltas, rounds)`` gives the certified ε at each δ;
    by default one composition of ``event`` by :class:`Accountant` per
    analysis and round count, queried at every δ. ``rounds=None``: a
    one-shot mechanism, the δ panel only. Analyses that are not proven are
    dashed and their status is in the legend.
    """
    import numpy as np

    from dpfl.accounting import schemes
    from dpfl.plotting import plot_epsilon_curves

    if epsilon is None:
        from dpfl.accounting.accountant import Accountant

        def epsilon(name: str, ds: Sequence[float], t: int) -> list[float]:
            acc = Accountant(name).compose(event, t)
            return [acc.epsilon(d).upper for d in ds]

    analyses = [str(r["analysis"]) for r in rows]
    names: dict[str, str] = {}
    dashed = []
    for row in rows:
        label = str(row["analysis"])
        if row.get("status", "proven") != "proven":
            label += f" ({row['status']})"
            dashed.append(label)
        names[str(row["analysis"])] = label
    desc = schemes.describe(event, None)
    unit = f"{desc['unit']}-level"
    deltas = sorted({float(d) for d in np.logspace(-10, -2, 9)} | {float(delta)})
    steps = rounds or 1
    grid = [steps]
    if rounds is not None and rounds > 1:
        grid = sorted({int(round(t)) for t in np.geomspace(1, rounds, 5)} | {rounds})
    by_delta: dict[str, list[float]] = {}
    by_rounds: dict[str, list[float]] = {}
    for a in analyses:  # one composition per round count, queried at every δ
        at = {t: epsilon(a, deltas if t == steps else [delta], t) for t in grid}
        by_delta[names[a]] = at[steps]
        by_rounds[names[a]] = [
            at[t][deltas.index(delta)] if t == steps else at[t][0] for t in grid
        ]
    kw: dict[str, Any] = {}
    if len(grid) > 1:
        kw = {
            "rounds": grid,
            "epsilon_by_rounds": by_rounds,
            "rounds_title": f"at δ = {delta:g}",
        }
    plot_epsilon_curves(
        path,
        deltas=deltas,
        epsilon_by_delta=by_delta,
        delta_title=f"after {steps} round{'s' if steps > 1 else ''}"
        if rounds is not None
        else "one release",
        epsilon_label=f"ε ({unit}, upper bound)",
        dashed=dashed,
        title=title,
        **kw,
    )


# -- PriFedSync (federated f-DP) -------------------------------------------------
def _pfs_args(p: argparse.ArgumentParser, calibrate: bool) -> None:
    if not calibrate:
        p.add_argument(
            "--noise-multiplier",
            type=float,
            required=True,
            help="the paper's sigma (noise std 2*C*sigma on the clipped sum)",
        )
    p.add_argument(
        "--batch-size", type=int, required=True, help="B, records per local step"
    )
    p.add_argument(
        "--records-per-client", type=int, required=True, help="n, records per client"
    )
    p.add_argument("--local-steps", type=int, required=True, help="K noisy steps")
    p.add_argument("--rounds", type=int, required=True, help="R rounds")
    p.add_argument(
        "--sync-probability",
        type=float,
        default=1.0,
        help="p, chance a client syncs in a round (visible to the server); "
        "default 1 (every round counts, as the paper's tables)",
    )
    p.add_argument("--num-clients", type=int, help="m, for the strong guarantee")
    p.add_argument(
        "--analysis",
        default="exact",
        choices=("exact", "clt"),
        help="exact (default, proven) or clt (the paper's approximation)",
    )
    p.add_argument(
        "--guarantee", default="weak", choices=("weak", "strong"), help="federated f-DP"
    )
    _add_budget(p, calibrate, default_delta=DEFAULT_DELTA, delta_only=not calibrate)
    _add_common(p, plot=not calibrate)


def _pfs_event(a: argparse.Namespace, sigma: float) -> Any:
    from dpfl.accounting import events as ev

    step = ev.WithoutReplacement(
        a.batch_size, a.records_per_client, ev.Gaussian(2.0 * sigma)
    )
    return ev.CheckIn(a.sync_probability, ev.SelfComposed(step, a.local_steps))


def _pfs_clt(a: argparse.Namespace, sigma: float) -> float:
    from dpfl.accounting import fdp

    return fdp.clt_mu(
        noise_multiplier=sigma,
        batch_size=a.batch_size,
        records_per_client=a.records_per_client,
        local_steps=a.local_steps,
        rounds=a.rounds,
    )


def _pfs_notes(a: argparse.Namespace, mu: float) -> list[str]:
    notes = [
        "exact: each synced round is K steps of C_{B/n}(G_{1/sigma}) (replace-one), "
        "composed over the rounds as a PLD; a client that does not sync pays "
        "nothing, and the server sees who syncs. The weak and strong federated "
        "guarantees (another client / all other clients as adversary) are both "
        "implied: those parties see less than the server."
    ]
    if a.guarantee == "strong" and a.num_clients:
        notes.append(
            f"the paper's strong guarantee sqrt(m-1)*mu = "
            f"{math.sqrt(a.num_clients - 1) * mu:.4g} is valid but loose: the strong "
            "guarantee equals the weak one."
        )
    return notes


def account_prifedsync(a: argparse.Namespace) -> Report:
    from dpfl.accounting import gaussian

    event = _pfs_event(a, a.noise_multiplier)
    mu = _pfs_clt(a, a.noise_multiplier)
    clt_row: dict[str, Any] = {"mu": mu, "delta": a.delta, **_formula("prifedsync/clt")}
    clt_row["epsilon"] = gaussian.gdp_epsilon(a.delta, mu=mu)
    rows = [clt_row]
    if a.analysis == "exact" or not a.json:
        from dpfl.accounting import fdp

        value = _accountant_epsilon(event, a.rounds, a.delta, None)
        value["mu_effective"] = fdp.mu_effective(
            epsilon=value["epsilon"], delta=a.delta
        )
        rows.insert(0, {**value, **_terms(event, None), "analysis": "exact"})
    terms = _terms(event, None)
    result = {**terms, **_pick(rows, a.analysis), "analysis": a.analysis}
    title = (
        f"PriFedSync: sigma={a.noise_multiplier}, B={a.batch_size}, "
        f"n={a.records_per_client}, K={a.local_steps}, R={a.rounds}, "
        f"p={a.sync_probability}"
    )
    notes = _pfs_notes(a, mu) + [f"clt (invalid): {_formula_basis('prifedsync/clt')}"]

    def curve(name: str, deltas: Sequence[float], rounds: int) -> list[float]:
        if name == "clt":
            m = _pfs_clt(_with(a, rounds=rounds), a.noise_multiplier)
            return [gaussian.gdp_epsilon(d, mu=m) for d in deltas]
        from dpfl.accounting.accountant import Accountant

        acc = Accountant(None).compose(event, rounds)
        return [acc.epsilon(d).upper for d in deltas]

    def plot(path: str) -> None:
        _plot_curves(
            path,
            event,
            rows,
            curve,
            delta=a.delta,
            rounds=a.rounds,
            title=title,
        )

    return Report(title, result, rows, notes, plot)


def _formula_basis(key: str) -> str:
    from dpfl.accounting import schemes

    return schemes.FORMULAS[key].basis


def calibrate_prifedsync(a: argparse.Namespace) -> Report:
    from dpfl.accounting import gaussian

    def epsilon_of(name: str, sigma: float) -> float:
        if name == "clt":
            return gaussian.gdp_epsilon(a.delta, mu=_pfs_clt(a, sigma))
        return _accountant_epsilon(_pfs_event(a, sigma), a.rounds, a.delta, None)[
            "epsilon"
        ]

    def describe(name: str) -> dict[str, Any]:
        terms = _terms(_pfs_event(a, 1.0), None)
        return (
            {**terms, **_formula("prifedsync/clt")}
            if name == "clt"
            else {
                **terms,
                "analysis": "exact",
            }
        )

    title = (
        f"PriFedSync noise for (epsilon={a.epsilon}, delta={a.delta}): "
        f"B={a.batch_size}, n={a.records_per_client}, K={a.local_steps}, "
        f"R={a.rounds}, p={a.sync_probability}"
    )
    return _calibrated(
        a, title, ["exact", "clt"], epsilon_of, describe, _pfs_notes(a, 0.0)[:1]
    )


# -- client-level DP-FedAvg ---------------------------------------------------------
def _fedavg_args(p: argparse.ArgumentParser, calibrate: bool) -> None:
    from dpfl.accounting import rdp

    p.add_argument("--clients", type=int, required=True, help="K, number of clients")
    p.add_argument("--cohort", type=int, required=True, help="m clients per round")
    p.add_argument("--rounds", type=int, required=True, help="rounds T")
    p.add_argument(
        "--analysis",
        default=rdp.ANALYSES[0],
        choices=rdp.ANALYSES,
        help=f"the analysis --json reports (default {rdp.ANALYSES[0]}, the tightest "
        "proven)",
    )
    if not calibrate:
        p.add_argument(
            "--noise-multiplier",
            type=float,
            required=True,
            help="noise std on the sum of clipped updates, divided by the clip",
        )
        p.add_argument("--threshold", type=float, help="Q: report the stop round")
    _add_budget(p, calibrate, default_delta=DEFAULT_DELTA)
    _add_common(p, plot=not calibrate)


def _fedavg_event(a: argparse.Namespace, sigma: float) -> Any:
    from dpfl.accounting import events as ev

    return ev.FixedCohort(a.cohort, a.clients, ev.Gaussian(sigma))


def _fedavg_epsilon(
    a: argparse.Namespace, sigma: float, name: str, delta: float, rounds: int
) -> float:
    from dpfl.accounting import rdp

    return rdp.dp_fedavg_epsilon(
        delta=delta,
        clients=a.clients,
        cohort_sizes=a.cohort,
        noise_multipliers=sigma,
        rounds=rounds,
        analysis=name,
    )


def account_dp_fedavg(a: argparse.Namespace) -> Report:
    from dpfl.accounting import rdp

    event = _fedavg_event(a, a.noise_multiplier)
    rows = []
    for name in [a.analysis] if a.json else list(rdp.ANALYSES):
        row: dict[str, Any] = {}
        if a.epsilon is not None:
            row["delta"] = rdp.dp_fedavg_delta(
                epsilon=a.epsilon,
                clients=a.clients,
                cohort_sizes=a.cohort,
                noise_multipliers=a.noise_multiplier,
                rounds=a.rounds,
                analysis=name,
            )
            row["epsilon"] = a.epsilon
        else:
            row["epsilon"] = _fedavg_epsilon(
                a, a.noise_multiplier, name, a.delta, a.rounds
            )
            row["delta"] = a.delta
        if a.threshold is not None and a.epsilon is not None:
            row["stop_round"] = rdp.dp_fedavg_stop_round(
                epsilon=a.epsilon,
                threshold=a.threshold,
                clients=a.clients,
                cohort_sizes=a.cohort,
                noise_multipliers=a.noise_multiplier,
                max_rounds=max(a.rounds, 1_000),
                analysis=name,
            )
        rows.append({**row, **_terms(event, name)})
    result = {**_pick(rows, a.analysis), "analysis": a.analysis, "rounds": a.rounds}
    title = (
        f"Client-level DP-FedAvg: K={a.clients}, m={a.cohort}, "
        f"noise multiplier={a.noise_multiplier}, rounds={a.rounds}"
    )

    def plot(path: str) -> None:
        _plot_curves(
            path,
            event,
            rows,
            lambda name, deltas, rounds: [
                _fedavg_epsilon(a, a.noise_multiplier, name, d, rounds) for d in deltas
            ],
            delta=a.delta or a.default_delta,
            rounds=a.rounds,
            title=f"Client-level DP-FedAvg: K={a.clients}, m={a.cohort}, "
            f"σ={a.noise_multiplier}",
        )

    return Report(
        title, result, rows, _basis_notes(event, [r["analysis"] for r in rows]), plot
    )


def calibrate_dp_fedavg(a: argparse.Namespace) -> Report:
    from dpfl.accounting import rdp

    event = _fedavg_event(a, 1.0)
    title = (
        f"Noise for client-level (epsilon={a.epsilon}, delta={a.delta}) after "
        f"{a.rounds} rounds of DP-FedAvg: K={a.clients}, m={a.cohort}"
    )
    names = [a.analysis] if a.json else list(rdp.ANALYSES)
    return _calibrated(
        a,
        title,
        rdp.ANALYSES,
        lambda name, sigma: _fedavg_epsilon(a, sigma, name, a.delta, a.rounds),
        lambda name: _terms(event, name),
        _basis_notes(event, names),
    )


# -- MS-PAFL ------------------------------------------------------------------------
def _mspafl_args(p: argparse.ArgumentParser, calibrate: bool) -> None:
    p.add_argument("--clients", type=int, default=100, help="K (default 100)")
    p.add_argument(
        "--probability", type=float, default=0.5, help="check-in p (default 0.5)"
    )
    if not calibrate:
        g = p.add_mutually_exclusive_group()
        g.add_argument(
            "--local-epsilon",
            type=float,
            help="per-round local epsilon of one upload (sets the noise by the "
            "analytic Gaussian with sensitivity 2C; default 0.5)",
        )
        g.add_argument(
            "--noise-multiplier", type=float, help="noise std / C of one upload"
        )
        p.add_argument(
            "--local-delta", type=float, default=1e-5, help="local delta (1e-5)"
        )
        p.add_argument(
            "--rounds-joined",
            type=int,
            help="N: also report a client that joined N rounds of a run (a "
            "statement about that run, not a bound before it)",
        )
    p.add_argument("--batch-size", type=int, default=32, help="b (default 32)")
    p.add_argument("--dataset-size", type=int, default=325, help="n_k (default 325)")
    p.add_argument("--local-steps", type=int, default=1, help="E (default 1)")
    p.add_argument("--replacement", action="store_true", help="WR subsampling")
    p.add_argument("--xi", type=float, default=0.5, help="Hoeffding xi (0.5)")
    p.add_argument("--rounds", type=int, default=50, help="R (default 50)")
    p.add_argument(
        "--analysis",
        default="sound",
        choices=("sound", "paper", "central", "local", "global"),
        help="the analysis --json reports (default sound, the proven one)",
    )
    _add_budget(p, calibrate, default_delta=DEFAULT_DELTA, delta_only=not calibrate)
    _add_common(p, plot=not calibrate)


def _mspafl_event(a: argparse.Namespace, sigma: float) -> Any:
    from dpfl.accounting import events as ev

    return ev.CheckIn(a.probability, ev.Gaussian(sigma))


def account_ms_pafl(a: argparse.Namespace) -> Report:
    from dpfl.accounting import checkin, gaussian

    if a.noise_multiplier is not None:
        sigma = a.noise_multiplier
        local_eps = gaussian.epsilon_for_delta(
            a.local_delta, noise_multiplier=sigma, sensitivity=2.0
        )
    else:
        local_eps = 0.5 if a.local_epsilon is None else a.local_epsilon
        sigma = gaussian.calibrate_analytic(
            epsilon=local_eps, delta=a.local_delta, sensitivity=2.0
        )
    event = _mspafl_event(a, sigma)
    gamma = checkin.subsampling_ratio(
        batch_size=a.batch_size,
        dataset_size=a.dataset_size,
        replacement=a.replacement,
        local_steps=a.local_steps,
    )
    rows: list[dict[str, Any]] = [
        {
            **_accountant_epsilon(event, a.rounds, a.delta, "sound"),
            **_terms(event, "sound"),
            "scope": f"{a.rounds} rounds, each w.p. p (visible) the full release",
        }
    ]
    if a.rounds_joined is not None:
        realised = checkin.sound_client(
            noise_multiplier=sigma,
            clip=1.0,
            rounds_joined=a.rounds_joined,
            delta=a.delta,
        )
        rows.append(
            {
                "epsilon": realised["epsilon"],
                "delta": a.delta,
                **_terms(event, "sound"),
                "analysis": "sound (realised)",
                "scope": f"a run in which the client joined {a.rounds_joined} rounds "
                "(a statement about that run)",
            }
        )
    rows.append(
        {
            **_accountant_epsilon(event, a.rounds, a.delta, "paper"),
            **_terms(event, "paper"),
            "scope": f"{a.rounds} rounds, each Poisson(p)-amplified",
        }
    )
    eps_c, delta_c = checkin.central_round(
        epsilon=local_eps,
        delta=a.local_delta,
        clients=a.clients,
        probability=a.probability,
        gamma=gamma,
        xi=a.xi,
    )
    eps_h, delta_h = checkin.central_round(
        epsilon=local_eps,
        delta=a.local_delta,
        clients=a.clients,
        probability=a.probability,
        gamma=gamma,
        xi=a.xi,
        tail="hoeffding",
    )
    local = checkin.local_total_moments(
        probability=a.probability,
        rounds=a.rounds,
        gamma=gamma,
        noise_multiplier=sigma,
        clip=1.0,
        delta=a.delta,
    )
    glob = checkin.global_total(
        eps_max=eps_c, delta_max=delta_c, rounds=a.rounds, delta_slack=a.delta
    )
    rows += [
        {
            "epsilon": eps_c,
            "delta": delta_c,
            **_formula("ms-pafl/central"),
            "scope": "one round, global model",
        },
        {
            "epsilon": eps_h,
            "delta": delta_h,
            **_formula("ms-pafl/central-hoeffding"),
            "scope": "one round, global model",
        },
        {
            "epsilon": local["epsilon"],
            "delta": a.delta,
            **_formula("ms-pafl/local"),
            "scope": "local total ("
            + (
                "validity conditions hold"
                if local["valid"]
                else "its validity conditions fail"
            )
            + ")",
        },
        {
            "epsilon": glob[0],
            "delta": glob[1],
            **_formula("ms-pafl/global"),
            "scope": f"{a.rounds} rounds, global model",
        },
    ]
    result = {
        **_terms(event, "sound" if a.analysis == "sound" else "paper"),
        **_pick(rows, a.analysis),
        "analysis": a.analysis,
        "noise_multiplier": sigma,
        "local_epsilon": local_eps,
        "gamma": gamma,
    }
    notes = _basis_notes(event, ["sound", "paper"]) + [
        f"{k.split('/')[1]} (invalid): {_formula_basis(k)}"
        for k in ("ms-pafl/central", "ms-pafl/local", "ms-pafl/global")
    ]
    title = (
        f"MS-PAFL: K={a.clients}, p={a.probability}, noise multiplier={sigma:.4g} "
        f"(local epsilon {local_eps:.4g} at {a.local_delta}), b={a.batch_size}, "
        f"n={a.dataset_size}, R={a.rounds}"
    )

    def plot(path: str) -> None:
        _plot_curves(
            path,
            event,
            [r for r in rows if r["analysis"] in ("sound", "paper")],
            delta=a.delta,
            rounds=a.rounds,
            title=f"MS-PAFL: p={a.probability}, σ={sigma:.4g}",
        )

    return Report(title, result, rows, notes, plot)


def calibrate_ms_pafl(a: argparse.Namespace) -> Report:
    if a.analysis not in ("sound", "paper"):
        raise DpflError(
            f"calibrate ms-pafl offers --analysis sound or paper; got {a.analysis!r}"
        )
    event = _mspafl_event(a, 1.0)
    title = (
        f"MS-PAFL noise for (epsilon={a.epsilon}, delta={a.delta}) after {a.rounds} "
        f"rounds: p={a.probability}"
    )
    names = [a.analysis] if a.json else ["sound", "paper"]
    return _calibrated(
        a,
        title,
        ["sound", "paper"],
        lambda name, sigma: _accountant_epsilon(
            _mspafl_event(a, sigma), a.rounds, a.delta, name
        )["epsilon"],
        lambda name: _terms(event, name),
        _basis_notes(event, names),
    )


# -- LOCKS --------------------------------------------------------------------------
def _locks_args(p: argparse.ArgumentParser, calibrate: bool) -> None:
    p.add_argument("--q1", type=float, required=True, help="first-stage probability")
    p.add_argument(
        "--max-p2",
        type=float,
        default=1.0,
        help="largest second-stage probability (default 1, all a run can promise)",
    )
    if not calibrate:
        p.add_argument(
            "--noise-multiplier",
            type=float,
            required=True,
            help="sigma_g: noise std / C of each uploaded update",
        )
        p.add_argument(
            "--norm-rounds",
            type=int,
            help="N1: also report a client that sent N1 noisy norms in a run (a "
            "statement about that run)",
        )
        p.add_argument("--update-rounds", type=int, help="N2: ... and N2 noisy updates")
    p.add_argument(
        "--norm-noise-ratio",
        type=float,
        default=4.0,
        help="sigma_n / sigma_g (default 4)",
    )
    p.add_argument("--rounds", type=int, required=True, help="rounds T")
    p.add_argument(
        "--analysis",
        default="server",
        choices=("server", "observer"),
        help="the adversary --json reports (default server, the stronger)",
    )
    _add_budget(p, calibrate, default_delta=DEFAULT_DELTA, delta_only=not calibrate)
    _add_common(p, plot=not calibrate)


def _locks_event(a: argparse.Namespace, sigma: float) -> Any:
    from dpfl.accounting import events as ev

    return ev.TwoStage(
        a.q1, 1, a.max_p2, ev.Gaussian(a.norm_noise_ratio * sigma), ev.Gaussian(sigma)
    )


def account_locks(a: argparse.Namespace) -> Report:
    from dpfl.accounting import rdp

    event = _locks_event(a, a.noise_multiplier)
    rows = []
    for name in ("server", "observer"):
        rows.append(
            {
                **_accountant_epsilon(event, a.rounds, a.delta, name),
                **_terms(event, name),
                "scope": f"{a.rounds} rounds: w.p. q1 a noisy norm, w.p. at most "
                "q1*max_p2 also a noisy update (who took part is seen)",
            }
        )
    if a.norm_rounds is not None:
        n2 = a.update_rounds if a.update_rounds is not None else a.norm_rounds
        realised = rdp.locks_server_view(
            norm_noise_multiplier=a.norm_noise_ratio * a.noise_multiplier,
            update_noise_multiplier=a.noise_multiplier,
            norm_rounds=a.norm_rounds,
            update_rounds=n2,
            delta=a.delta,
        )
        rows.append(
            {
                "epsilon": realised["epsilon"],
                "delta": a.delta,
                "mu": realised["mu"],
                **_terms(event, "server"),
                "analysis": "server (realised)",
                "scope": f"a run in which the client sent N1={a.norm_rounds} norms "
                f"and N2={n2} updates (a statement about that run)",
            }
        )
    elif a.update_rounds is not None:
        raise DpflError("--update-rounds needs --norm-rounds (N2 <= N1)")
    result = {**_pick(rows, a.analysis), "analysis": a.analysis}
    title = (
        f"LOCKS: q1={a.q1}, max p2={a.max_p2}, sigma_g={a.noise_multiplier}, "
        f"sigma_n={a.norm_noise_ratio * a.noise_multiplier:g}, T={a.rounds}"
    )

    def plot(path: str) -> None:
        _plot_curves(
            path,
            event,
            [r for r in rows if r["analysis"] in ("server", "observer")],
            delta=a.delta,
            rounds=a.rounds,
            title=title,
        )

    return Report(
        title, result, rows, _basis_notes(event, ["server", "observer"]), plot
    )


def calibrate_locks(a: argparse.Namespace) -> Report:
    # both adversaries are priced alike (the observer is bounded by the server)
    event = _locks_event(a, 1.0)
    title = (
        f"LOCKS noise for (epsilon={a.epsilon}, delta={a.delta}) after {a.rounds} "
        f"rounds: q1={a.q1}, max p2={a.max_p2}, sigma_n/sigma_g={a.norm_noise_ratio}"
    )
    return _calibrated(
        a,
        title,
        ["server", "observer"],
        lambda name, sigma: _accountant_epsilon(
            _locks_event(a, sigma), a.rounds, a.delta, name
        )["epsilon"],
        lambda name: _terms(event, name),
        _basis_notes(event, ["server", "observer"]),
        norm_noise_multiplier=lambda sigma: a.norm_noise_ratio * sigma,
    )


# -- Gaussian mechanism ---------------------------------------------------------------
def _gauss_args(p: argparse.ArgumentParser, calibrate: bool) -> None:
    p.add_argument(
        "--sensitivity",
        type=float,
        default=1.0,
        help="norm bound of one contribution in units of the clip (default 1)",
    )
    if not calibrate:
        p.add_argument(
            "--noise-multiplier",
            type=float,
            required=True,
            help="noise std / clip (sigma)",
        )
    p.add_argument(
        "--analysis",
        default="exact",
        choices=("exact", "classic"),
        help="exact (analytic Gaussian, default) or classic (Dwork-Roth formula)",
    )
    _add_budget(p, calibrate, default_delta=DEFAULT_DELTA)
    _add_common(p, plot=not calibrate)


def account_gaussian(a: argparse.Namespace) -> Report:
    from dpfl.accounting import events as ev
    from dpfl.accounting import gaussian

    kw = {"noise_multiplier": a.noise_multiplier, "sensitivity": a.sensitivity}
    if a.epsilon is not None:
        value = {
            "delta": gaussian.delta_for_epsilon(a.epsilon, **kw),
            "epsilon": a.epsilon,
        }
    else:
        value = {"epsilon": gaussian.epsilon_for_delta(a.delta, **kw), "delta": a.delta}
    value["mu"] = gaussian.mu_from_noise(**kw)
    event = ev.Gaussian(a.noise_multiplier, a.sensitivity)
    result = {**value, **_terms(event, None)}
    row = {**value, **_terms(event, None)}

    def plot(path: str) -> None:
        _plot_curves(
            path,
            event,
            [row],
            lambda name, deltas, rounds: [
                gaussian.epsilon_for_delta(d, **kw) for d in deltas
            ],
            delta=a.delta or a.default_delta,
            rounds=None,
            title=f"Gaussian mechanism: σ={a.noise_multiplier}, "
            f"sensitivity={a.sensitivity}",
        )

    return Report(
        "Gaussian mechanism", result, [row], _basis_notes(event, ["exact"]), plot
    )


def calibrate_gaussian(a: argparse.Namespace) -> Report:
    from dpfl.accounting import events as ev
    from dpfl.accounting import gaussian

    exact = gaussian.calibrate_analytic(
        epsilon=a.epsilon, delta=a.delta, sensitivity=a.sensitivity
    )
    classic, warning = gaussian.classic_sigma(
        epsilon=a.epsilon, delta=a.delta, sensitivity=a.sensitivity
    )
    event = ev.Gaussian(exact, a.sensitivity)
    rows = [
        {"noise_multiplier": exact, **_terms(event, None)},
        {
            "noise_multiplier": classic,
            **_terms(event, None),
            **_formula("gaussian/classic"),
        },
    ]
    result = {**_pick(rows, a.analysis), "analysis": a.analysis}
    notes = _basis_notes(event, ["exact"]) + [
        f"classic: {_formula_basis('gaussian/classic')}"
    ]
    return Report(
        "Gaussian mechanism calibration",
        result,
        rows,
        notes + ([warning] if warning else []),
    )


SCHEMES: dict[str, tuple[Callable[..., None], Callable | None, Callable | None]] = {
    "random-participation": (
        _rp_args,
        account_random_participation,
        calibrate_random_participation,
    ),
    "prifedsync": (_pfs_args, account_prifedsync, calibrate_prifedsync),
    "dp-fedavg": (_fedavg_args, account_dp_fedavg, calibrate_dp_fedavg),
    "ms-pafl": (_mspafl_args, account_ms_pafl, calibrate_ms_pafl),
    "locks": (_locks_args, account_locks, calibrate_locks),
    "gaussian": (_gauss_args, account_gaussian, calibrate_gaussian),
}


# ---------------------------------------------------------------------------
# Audits: an empirical lower bound beside the upper bounds
# ---------------------------------------------------------------------------
def _audit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--trials",
        type=int,
        default=1_000_000,
        help="trials on each side of the neighbouring pair (default 1e6)",
    )
    p.add_argument(
        "--confidence",
        type=float,
        default=0.95,
        help="probability that the lower bound holds (default 0.95)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the audit (default 0)")


def _rp_audit_args(p: argparse.ArgumentParser, calibrate: bool) -> None:
    _rp_args(p, False)
    p.add_argument(
        "--configuration",
        default="zero",
        choices=("zero", "collinear", "angled"),
        help="gradients of the client's other sampled records (default zero)",
    )
    p.add_argument(
        "--angle",
        type=float,
        default=90.0,
        help="degrees between companions and target for 'angled' (default 90)",
    )
    _audit_args(p)


def _gauss_audit_args(p: argparse.ArgumentParser, calibrate: bool) -> None:
    _gauss_args(p, False)
    _audit_args(p)


def _audit_report(a: argparse.Namespace, upper: Report, pair: Any, what: str) -> Report:
    from dpfl.audit import audit_mechanism

    if a.epsilon is not None:
        raise InvalidParameterError(
            "dpfl audit reports epsilon at a delta: give --delta, not --epsilon"
        )
    res = audit_mechanism(
        pair,
        trials=a.trials,
        delta=a.delta,
        rounds=getattr(a, "rounds", 1),
        confidence=a.confidence,
        seed=a.seed,
    )
    claimed = float(upper.result["epsilon"])
    result = {
        "epsilon_lower_bound": res.epsilon,
        "confidence": res.confidence,
        "delta": res.delta,
        "epsilon_upper_bound": claimed,
        "upper_bound_analysis": upper.result.get("analysis", "exact"),
        "ratio": res.epsilon / claimed if claimed > 0 else math.inf,
        "audited": what,
        "trials": res.negatives_trials,
        "false_positives": res.false_positives,
        "false_negatives": res.false_negatives,
        "threshold": res.threshold,
    }
    rows = [
        {**r, "refuted_by_audit": res.epsilon > float(r["epsilon"])}
        for r in upper.rows
        if "epsilon" in r
    ]
    notes = upper.notes + [
        f"audit: epsilon >= {res.epsilon:.4g} at delta={res.delta:g} with "
        f"confidence {res.confidence:g} ({what}; likelihood-ratio test, "
        f"{res.negatives_trials} trials a side, Clopper-Pearson intervals); an "
        "upper bound below it is refuted"
    ]
    return Report(f"Audit of {upper.title}", result, rows, notes)


def audit_random_participation(a: argparse.Namespace) -> Report:
    from dpfl.audit import RandomParticipationPair

    upper = account_random_participation(_with(a, json=False))
    pair = RandomParticipationPair(
        a.p,
        a.q,
        a.records_per_client,
        a.noise_multiplier,
        configuration=a.configuration,
        angle=math.radians(a.angle),
    )
    upper.result = {
        **next(r for r in upper.rows if r["analysis"] == a.analysis),
        "analysis": a.analysis,
    }
    return _audit_report(a, upper, pair, f"{a.configuration} companions")


def audit_gaussian(a: argparse.Namespace) -> Report:
    from dpfl.audit import GaussianPair

    upper = account_gaussian(a)
    return _audit_report(
        a, upper, GaussianPair(a.noise_multiplier, a.sensitivity), "Gaussian pair"
    )


def _train_audit_args(p: argparse.ArgumentParser, record: bool) -> None:
    p.add_argument(
        "--clients",
        type=int,
        default=20,
        help="real clients on the digits (default 20)",
    )
    p.add_argument(
        "--canaries",
        type=int,
        default=1000,
        help="Dirac canaries per run, one model coordinate each (default 1000)",
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds per run (default 3)")
    p.add_argument("--runs", type=int, default=1, help="independent runs (default 1)")
    p.add_argument("--noise-multiplier", type=float, required=True, help="sigma")
    p.add_argument("--clip", type=float, default=1.0, help="clipping bound C")
    if record:
        p.add_argument("--p", type=float, default=0.5, help="participation prob.")
        p.add_argument("--q", type=float, default=0.5, help="record sampling prob.")
    else:
        p.add_argument(
            "--sampling",
            default="all",
            choices=("all", "poisson"),
            help="every client every round (fixed cohort of K), or Poisson clients "
            "at --participation (default all)",
        )
        p.add_argument(
            "--participation",
            type=float,
            default=0.1,
            help="a client's per-round probability with --sampling poisson",
        )
    p.add_argument(
        "--hidden", type=int, default=64, help="MLP hidden width (default 64)"
    )
    p.add_argument(
        "--protocol",
        default="multi-run",
        choices=("multi-run", "one-run"),
        help="multi-run: canaries on disjoint coordinates as independent trials, "
        "Clopper-Pearson; one-run: Steinke, Nasr & Jagielski (2023) guesses",
    )
    p.add_argument(
        "--threat",
        default="white-box",
        choices=("white-box", "black-box"),
        help="white-box: the adversary sees every round's noisy aggregate; "
        "black-box: the final model only (one-run protocol)",
    )
    p.add_argument(
        "--delta",
        type=float,
        default=DEFAULT_DELTA,
        help="delta of both bounds",
    )
    p.add_argument(
        "--confidence",
        type=float,
        default=0.95,
        help="probability that the lower bound holds (default 0.95)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the runs (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument(
        "--plot", metavar="FILE", help="write the trade-off figure (FILE.png, .pdf)"
    )


def _train_audit(
    a: argparse.Namespace, algorithm: str, params: dict[str, Any]
) -> Report:
    import torch

    from dpfl.audit.plot import plot_tradeoff
    from dpfl.audit.training import audit_training
    from dpfl.data import get_dataset
    from dpfl.models import build_model

    data = get_dataset("digits", num_clients=a.clients, seed=a.seed)

    def model(ds: Any) -> Any:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(a.seed)
            return build_model(
                "mlp",
                input_shape=ds.input_shape,
                num_classes=ds.num_classes,
                hidden=(a.hidden,),
            )

    res = audit_training(
        algorithm,
        params,
        data,
        noise_multiplier=a.noise_multiplier,
        model=model,
        canaries=a.canaries,
        rounds=a.rounds,
        delta=a.delta,
        protocol=a.protocol,
        threat=a.threat,
        runs=a.runs,
        confidence=a.confidence,
        seed=a.seed,
    )
    result = {
        "epsilon_lower_bound": res.epsilon,
        "confidence": res.confidence,
        "delta": res.delta,
        "epsilon_upper_bound": res.reported_epsilon,
        "ratio": res.ratio,
        **{
            k: v
            for k, v in res.to_dict().items()
            if k not in ("epsilon", "delta", "confidence", "reported_epsilon", "ratio")
        },
    }
    notes = [
        f"audit: epsilon >= {res.epsilon:.4g} at delta={res.delta:g} with confidence "
        f"{res.confidence:g} ({res.level}-level Dirac canaries in a real "
        f"{res.algorithm} run on the digits, {res.threat}, {res.protocol}); dpfl "
        f"reports epsilon <= {res.reported_epsilon:.4g}: a lower bound on this "
        "implementation against this attack, not a proof of privacy"
    ]
    row = {
        "analysis": "audit",
        "epsilon": res.epsilon,
        "upper": res.reported_epsilon,
        "ratio": res.ratio,
    }
    return Report(
        f"Audit of {algorithm} ({res.level} level)",
        result,
        [row],
        notes,
        plot=lambda path: None if plot_tradeoff(res, path) else None,
    )


def _fedavg_audit_args(p: argparse.ArgumentParser, calibrate: bool) -> None:
    _train_audit_args(p, record=False)


def _dsgd_audit_args(p: argparse.ArgumentParser, calibrate: bool) -> None:
    _train_audit_args(p, record=True)


def audit_dp_fedavg(a: argparse.Namespace) -> Report:
    clients = a.clients + a.canaries
    if a.sampling == "all":
        params: dict[str, Any] = {"cohort_size": clients}
    else:
        params = {
            "cohort_size": max(1, round(a.participation * clients)),
            "sampling": "poisson",
        }
    return _train_audit(a, "dp-fedavg", {**params, "clip": a.clip})


def audit_dp_dsgd(a: argparse.Namespace) -> Report:
    params = {"participation_probability": a.p, "record_probability": a.q}
    return _train_audit(a, "dsgd-rp", {**params, "clip": a.clip})


AUDITS: dict[str, tuple[Callable[..., None], Callable[..., Report]]] = {
    "random-participation": (_rp_audit_args, audit_random_participation),
    "gaussian": (_gauss_audit_args, audit_gaussian),
    "dp-fedavg": (_fedavg_audit_args, audit_dp_fedavg),
    "dp-dsgd": (_dsgd_audit_args, audit_dp_dsgd),
}


# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------
#: One line per scheme, for ``dpfl account --help`` and ``dpfl calibrate --help``.
SCHEME_HELP = {
    "random-participation": "DP-DSGD with random client participation "
    "(client rate p, record rate q); record-level",
    "prifedsync": "PriFedSync: K noisy local steps per synced round; "
    "federated f-DP, record-level",
    "dp-fedavg": "client-level DP-FedAvg with a fixed-size cohort of m of K clients",
    "ms-pafl": "MS-PAFL: clients check in with probability p and upload noisy models",
    "locks": "LOCKS: two-stage client sampling with a noisy norm and a noisy update",
    "gaussian": "one Gaussian mechanism (analytic, Balle & Wang 2018)",
}

#: One line per audit, for ``dpfl audit --help``.
AUDIT_HELP = {
    "random-participation": "DP-DSGD with random participation: the attack's "
    "epsilon lower bound beside every analysis's upper bound",
    "gaussian": "one Gaussian mechanism: the attack's lower bound beside the exact "
    "epsilon",
    "dp-fedavg": "client-level DP-FedAvg on the digits with canary clients: the "
    "audit's lower bound beside the run's reported epsilon",
    "dp-dsgd": "record-level DP-DSGD on the digits with gradient canaries: the "
    "audit's lower bound beside the run's reported epsilon",
}

#: The audits that draw a trade-off figure (``--plot FILE``): the training audits.
AUDIT_FIGURES = frozenset({"dp-fedavg", "dp-dsgd"})

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


def _analysis_statuses(scheme: str) -> str:
    """``wcs (proven), sound (open), ...``: each analysis of a scheme's table."""
    from dpfl.accounting import events as ev
    from dpfl.accounting import schemes

    g = ev.Gaussian(1.0)
    events = {
        "random-participation": ev.ClientPoisson(0.5, ev.RecordPoisson(0.5, 2, g)),
        "dp-fedavg": ev.FixedCohort(1, 2, g),
        "ms-pafl": ev.CheckIn(0.5, g),
        "locks": ev.TwoStage(0.5, 1, 0.5, g, g),
    }
    formulas = {
        "prifedsync": [("exact", "proven"), ("clt", "prifedsync/clt")],
        "gaussian": [("exact", "proven"), ("classic", "gaussian/classic")],
        "ms-pafl": [(k, f"ms-pafl/{k}") for k in ("central", "local", "global")],
    }
    pairs: list[tuple[str, str]] = []
    if scheme in events:
        pairs += [
            (a.name, a.status) for a in schemes.scheme_of(events[scheme]).analyses
        ]
    for name, key in formulas.get(scheme, []):
        pairs.append((name, schemes.FORMULAS[key].status if "/" in key else key))
    return ", ".join(f"{n} ({st})" for n, st in pairs)


def _drop_option(parser: argparse.ArgumentParser, flag: str) -> None:
    """Remove an option that shared argument helpers added but ``parser`` lacks."""
    for action in list(parser._actions):
        if flag in action.option_strings:
            parser._remove_action(action)
            for group in parser._action_groups:
                if action in group._group_actions:
                    group._group_actions.remove(action)
            for option in action.option_strings:
                parser._option_string_actions.pop(option, None)


def build_parser() -> argparse.ArgumentParser:
    """Return the ``dpfl`` argument parser."""
    from dpfl import __version__
    from dpfl.experiments.cli import add_subcommands

    parser = _Parser(
        prog="dpfl",
        description="Differentially private federated learning: account, calibrate, "
        "audit, train, sweep. Accounting works without the [train] extra.",
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for mode, help_text in (
        ("account", "report the privacy of a scheme (every analysis side by side)"),
        ("calibrate", "find the noise multiplier for a target (epsilon, delta)"),
    ):
        mp = sub.add_parser(mode, help=help_text)
        schemes = mp.add_subparsers(dest="scheme", required=True, parser_class=_Parser)
        for name, (add_args, acc, cal) in SCHEMES.items():
            handler = acc if mode == "account" else cal
            if handler is None:
                continue
            sp = schemes.add_parser(
                name, help=SCHEME_HELP[name], description=SCHEME_HELP[name]
            )
            add_args(sp, mode == "calibrate")
            for action in sp._actions:
                if action.dest == "analysis" and action.help:
                    action.help += (
                        f"; the table shows every one: {_analysis_statuses(name)} "
                        "(proven: a valid bound; open: not known to be one; "
                        "invalid: not a worst-case bound, for comparison)"
                    )
            sp.set_defaults(handler=handler)
    ap = sub.add_parser(
        "audit",
        help="attack a mechanism: an empirical lower bound on epsilon beside the "
        "upper bounds",
    )
    audits = ap.add_subparsers(dest="scheme", required=True, parser_class=_Parser)
    for name, (add_args, handler) in AUDITS.items():
        sp = audits.add_parser(name, help=AUDIT_HELP.get(name))
        add_args(sp, False)
        if name not in AUDIT_FIGURES:
            _drop_option(sp, "--plot")  # no trade-off figure: refuse the flag
        sp.set_defaults(handler=handler)
    add_subcommands(sub)  # registered always: a missing extra is named on use
    _check_flags(parser)
    return parser


#: Rounds an idle OpenMP worker spins before it sleeps (GNU libgomp, the
#: OpenMP of torch's Linux wheels), for the training commands. libgomp's
#: default, 300,000, keeps each worker busy for milliseconds after every
#: parallel region, so the thread that draws a round's noise while the
#: gradients are computed shares a core with a spinner. With 10,000 the
#: non-private round is as fast as with the default and the DP round hides
#: its noise draw (paper scenario 1, 2 cores: DP/non-private 1.26 vs 1.31 in
#: random order, 1.31-1.34 vs 1.39-1.41 in fixed order; notes/engine.md).
GOMP_SPINCOUNT = "10000"


def openmp_defaults(env: MutableMapping[str, str], spin: str = GOMP_SPINCOUNT) -> None:
    """Set ``GOMP_SPINCOUNT`` in ``env`` unless it names a wait policy or spin.

    Only acts on a process that loads torch (and so libgomp) afterwards: the
    command line does so lazily, and ``benchmarks/engine.py`` for its timed
    subprocesses.

    Parameters
    ----------
    env : mutable mapping of str to str
        An environment (``os.environ`` or a child's copy); modified.
    spin : str
        The spin count to set.
    """
    if "OMP_WAIT_POLICY" not in env:
        env.setdefault("GOMP_SPINCOUNT", spin)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
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
        print("dpfl: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
