"""What ``dpfl account``, ``calibrate`` and ``audit`` print, and how papers fill it.

:class:`Report` is a command's result: the chosen analysis's numbers (``--json``)
and a table with every analysis side by side. :func:`account` and
:func:`calibrate` are the drivers every paper's handlers call: they price the
scheme's event with the :class:`~dpfl.accounting.accountant.Accountant`, the
same one a run's ledger uses, or, for a paper's own formulas (listed by
:data:`dpfl.accounting.schemes.FORMULAS` or priced by a Rényi accountant), by
the formula the paper names; each row carries the guarantee's terms and the
analysis's status.

The JSON is strict: a non-finite number (an ε with no finite bound) is the
string ``"inf"``, ``"-inf"`` or ``"nan"``, never the non-standard ``Infinity``
or ``NaN``.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dpfl._parallel import map_ordered
from dpfl.errors import DpflError

__all__ = [
    "Formula",
    "Report",
    "account",
    "basis_notes",
    "bound",
    "calibrate",
    "formula",
    "formula_basis",
    "pick",
    "plot_curves",
    "scheme_analyses",
    "strict_json",
    "terms",
    "with_",
]

#: A paper's own pricing of one analysis:
#: ``price(analysis, rounds=T, delta=d, epsilon=e)`` (one of ``delta`` and
#: ``epsilon`` given) returns the row's ``epsilon`` and ``delta`` (and their
#: ``_lower`` ends where it brackets them).
Formula = Callable[..., dict[str, Any]]


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
        """The title, the terms every row shares, the rows and the notes."""
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


# -- terms, statuses and notes ---------------------------------------------------
def terms(event: Any, analysis: str | None) -> dict[str, Any]:
    """The guarantee's terms and the analysis's status, for JSON and tables."""
    from dpfl.accounting import schemes

    d = schemes.describe(event, analysis)
    return {
        k: d[k] for k in ("unit", "neighbouring", "adversary", "analysis", "status")
    }


def formula(key: str) -> dict[str, Any]:
    """Status row fields of a paper formula (see ``schemes.FORMULAS``)."""
    from dpfl.accounting import schemes

    a = schemes.FORMULAS[key]
    out: dict[str, Any] = {"analysis": a.name, "status": a.status}
    if a.adversary:
        out["adversary"] = a.adversary
    return out


def formula_basis(key: str) -> str:
    """What a paper formula rests on (see ``schemes.FORMULAS``)."""
    from dpfl.accounting import schemes

    return schemes.FORMULAS[key].basis


def basis_notes(event: Any, names: Sequence[str]) -> list[str]:
    """One note per analysis shown: its status and what it rests on."""
    from dpfl.accounting import schemes

    scheme = schemes.scheme_of(event)
    out = []
    for name in names:
        a = scheme.analysis(name)
        out.append(f"{a.name} ({a.status}): {a.basis}")
    return out


def scheme_analyses(
    event: Any = None, formulas: Sequence[str] = (), *, exact: bool = False
) -> list[tuple[str, str]]:
    """``[(name, status), ...]``: a scheme's analyses, then a paper's formulas.

    Parameters
    ----------
    event : Event, optional
        An event of the scheme (its analyses come first).
    formulas : sequence of str
        Keys of :data:`dpfl.accounting.schemes.FORMULAS`.
    exact : bool
        List the accountant's default as one ``exact`` analysis (proven).
    """
    from dpfl.accounting import schemes

    pairs = [("exact", "proven")] if exact else []
    if event is not None:
        pairs += [(a.name, a.status) for a in schemes.scheme_of(event).analyses]
    pairs += [(schemes.FORMULAS[k].name, schemes.FORMULAS[k].status) for k in formulas]
    return pairs


def pick(rows: list[dict[str, Any]], analysis: str) -> dict[str, Any]:
    """The row of ``analysis``, without its name (the result of ``--json``)."""
    for row in rows:
        if row["analysis"] == analysis:
            return {k: v for k, v in row.items() if k != "analysis"}
    raise DpflError(f"no analysis {analysis!r} among {[r['analysis'] for r in rows]}")


def with_(a: argparse.Namespace, **changes: Any) -> argparse.Namespace:
    """A copy of the parsed flags with some changed."""
    return argparse.Namespace(**{**vars(a), **changes})


# -- pricing -----------------------------------------------------------------------
def bound(
    event: Any,
    rounds: int,
    analysis: str | None,
    *,
    delta: float | None = None,
    epsilon: float | None = None,
    lower: bool = True,
) -> dict[str, float]:
    """``rounds`` rounds of ``event`` priced by the Accountant: ε at δ, or δ at ε.

    Parameters
    ----------
    event : Event
        One round.
    rounds : int
        Number of rounds.
    analysis : str or None
        The analysis (``None``: the scheme's default).
    delta, epsilon : float, optional
        Exactly one: report ε at ``delta`` or δ at ``epsilon``.
    lower : bool
        Also report the bracket's lower end (``epsilon_lower`` or
        ``delta_lower``).

    Returns
    -------
    dict
        ``epsilon``, ``delta`` and, with ``lower``, the lower end.
    """
    from dpfl.accounting.accountant import Accountant

    acc = Accountant(analysis).compose(event, rounds)
    if epsilon is not None:
        b = acc.delta(epsilon)
        out = {"delta": b.upper, "delta_lower": b.lower, "epsilon": epsilon}
    elif delta is not None:
        b = acc.epsilon(delta)
        out = {"epsilon": b.upper, "epsilon_lower": b.lower, "delta": delta}
    else:
        raise TypeError("give delta or epsilon")
    if not lower:
        out.pop("delta_lower" if epsilon is not None else "epsilon_lower")
    return out


def account(
    a: argparse.Namespace,
    event: Any,
    names: Sequence[str],
    title: str,
    *,
    plot_title: str,
    formulas: Mapping[str, Formula] | None = None,
    lower: bool = True,
    columns: Callable[[str], dict[str, Any]] | None = None,
) -> Report:
    """``dpfl account``: ``a.rounds`` rounds of ``event``, one row per analysis.

    ``--json`` prices ``a.analysis`` only; the table prices every one of
    ``names``. Each is priced by the Accountant (:func:`bound`) unless
    ``formulas`` names it, at ``a.delta`` or ``a.epsilon``.

    Parameters
    ----------
    a : argparse.Namespace
        The flags (``analysis``, ``rounds``, ``delta``, ``epsilon``, ``json``).
    event : Event
        One round of the scheme.
    names : sequence of str
        The analyses of the table.
    title, plot_title : str
        Of the table and of ``--plot``'s figure.
    formulas : mapping, optional
        Analyses priced by a paper's formula rather than the Accountant.
    lower : bool
        Report the Accountant's bracket (its lower end) beside the bound.
    columns : callable, optional
        ``columns(analysis)``: extra columns of a row.

    Returns
    -------
    Report
        The chosen analysis's row (with ``analysis`` and ``rounds``) and the
        table, with a note per analysis on what it rests on.
    """
    formulas = dict(formulas or {})
    target = {"epsilon": a.epsilon} if a.epsilon is not None else {"delta": a.delta}

    def row(name: str) -> dict[str, Any]:
        if name in formulas:
            value = formulas[name](name, rounds=a.rounds, **target)
        else:
            value = bound(event, a.rounds, name, lower=lower, **target)
        return {**value, **(columns(name) if columns else {}), **terms(event, name)}

    # the analyses share nothing: priced side by side, one per core
    rows = map_ordered(row, [a.analysis] if a.json else list(names))
    result = {**pick(rows, a.analysis), "analysis": a.analysis, "rounds": a.rounds}

    def curve(name: str, deltas: Sequence[float], rounds: int) -> list[float]:
        if name in formulas:
            return [
                formulas[name](name, rounds=rounds, delta=d)["epsilon"] for d in deltas
            ]
        from dpfl.accounting.accountant import Accountant

        acc = Accountant(name).compose(event, rounds)
        return [acc.epsilon(d).upper for d in deltas]

    def plot(path: str) -> None:
        plot_curves(
            path,
            event,
            rows,
            curve,
            delta=a.delta or a.default_delta,
            rounds=a.rounds,
            title=plot_title,
        )

    notes = basis_notes(event, [r["analysis"] for r in rows])
    return Report(title, result, rows, notes, plot)


def _value(epsilon_of: Callable[[float], float], sigma: float) -> float:
    """``epsilon_of(sigma)``, with numerical overflow read as "no guarantee"."""
    try:
        value = float(epsilon_of(sigma))
    except (OverflowError, FloatingPointError, ZeroDivisionError):
        return math.inf
    return math.inf if math.isnan(value) else value


def _near(
    epsilon_of: Callable[[float], float],
    target: float,
    guide: Callable[[float], float],
    tolerance: float = 1e-3,
) -> float | None:
    """The smallest σ meeting ``target``, searched outward from ``guide``'s σ.

    ``guide`` is a fast estimate of the same ε(σ) (a closed form of the
    analysis): its σ starts the search, ``epsilon_of`` decides every step, so
    the result meets the target by ``epsilon_of`` alone, within ``tolerance``
    as :func:`~dpfl.accounting.calibrate.solve_noise_multiplier`'s does. None
    if the guide finds no σ or the search leaves the calibrator's range.
    """
    from dpfl.accounting.calibrate import LARGEST, SMALLEST, solve_noise_multiplier

    try:
        lo = hi = solve_noise_multiplier(guide, epsilon=target, tolerance=1e-2)
    except DpflError:
        return None
    step = 1.005  # about the Accountant's tolerance
    if _value(epsilon_of, hi) > target:
        while _value(epsilon_of, hi) > target:
            lo, hi, step = hi, hi * step, step * step
            if hi > LARGEST:
                return None
    else:
        lo = lo / step
        while _value(epsilon_of, lo) <= target:
            hi, lo, step = lo, lo / step, step * step
            if lo < SMALLEST:
                return None
    # invariant: epsilon_of(lo) > target >= epsilon_of(hi)
    while hi / lo - 1.0 > tolerance:
        mid = math.sqrt(lo * hi)
        if _value(epsilon_of, mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def _solve(
    epsilon_of: Callable[[float], float],
    target: float,
    what: str,
    guide: Callable[[float], float] | None = None,
) -> tuple[float | None, dict[str, Any], str | None]:
    """σ for a target, or (None, flag, note) when the analysis certifies any σ."""
    from dpfl.accounting.calibrate import CertifiesEverySigma, solve_noise_multiplier

    sigma = None if guide is None else _near(epsilon_of, target, guide)
    if sigma is not None:
        return sigma, {}, None
    try:
        return solve_noise_multiplier(epsilon_of, epsilon=target, what=what), {}, None
    except CertifiesEverySigma as exc:
        return None, {"certifies_every_sigma": True}, str(exc)


#: The width, as a fraction of the target ε, to which :func:`calibrate`
#: resolves each ε(σ) it computes with the Accountant.
_RESOLUTION = 1e-3


def calibrate(
    a: argparse.Namespace,
    title: str,
    names: Sequence[str],
    make_event: Callable[[float], Any],
    *,
    epsilon_of: Mapping[str, Callable[[float], float]] | None = None,
    guide: Mapping[str, Callable[[float], float]] | None = None,
    describe: Callable[[str], dict[str, Any]] | None = None,
    notes: Sequence[str] | None = None,
    **extra: Callable[[float], float],
) -> Report:
    """``dpfl calibrate``: σ per analysis for ``(a.epsilon, a.delta)``, one calibrator.

    Each analysis's ε(σ) is the Accountant's certified bound on ``a.rounds``
    rounds of ``make_event(σ)`` (the ledger's tolerance, or a bracket at most
    0.1% of the target wide: only whether ε meets the target matters), unless
    ``epsilon_of`` gives another (a paper's own formula, or the Accountant
    under another name); :func:`~dpfl.accounting.calibrate.solve_noise_multiplier`
    finds the smallest σ that meets the target. ``--json`` calibrates
    ``a.analysis`` only.

    Parameters
    ----------
    a : argparse.Namespace
        The flags (``analysis``, ``rounds``, ``epsilon``, ``delta``, ``json``).
    title : str
        Of the table.
    names : sequence of str
        The analyses of the table.
    make_event : callable
        σ to one round of the scheme.
    epsilon_of : mapping, optional
        Analyses whose certified ε(σ) is given: name to a function of σ.
    guide : mapping, optional
        Fast estimates of ε(σ) (a closed form of the same analysis) by
        name: they say where to search; the certified ε(σ) decides.
    describe : callable, optional
        ``describe(analysis)``: the row's terms and status (default: the
        scheme's, :func:`terms`).
    notes : sequence of str, optional
        Notes below the table (default: what each analysis calibrated rests
        on, :func:`basis_notes`).
    **extra : callable
        Extra columns, each a function of the calibrated σ.

    Returns
    -------
    Report
        The chosen analysis's σ (with the target and rounds) and the table.
    """
    from dpfl.accounting.accountant import Accountant

    given = dict(epsilon_of or {})
    event = make_event(1.0)

    def epsilon(name: str, sigma: float) -> float:
        if name in given:
            return given[name](sigma)
        # only "is epsilon below the target?" matters: resolve it to a
        # fraction of the target (Accountant's resolution), not of epsilon,
        # and no further than the side of the target it falls on
        acc = Accountant(name, resolution=_RESOLUTION * a.epsilon, threshold=a.epsilon)
        return acc.compose(make_event(sigma), a.rounds).epsilon(a.delta).upper

    def default_describe(name: str) -> dict[str, Any]:
        return terms(event, name)

    describe = describe or default_describe

    def solve(name: str) -> tuple[float | None, dict[str, Any], str | None]:
        return _solve(
            functools.partial(epsilon, name),
            a.epsilon,
            f"(epsilon={a.epsilon}, delta={a.delta}) after {a.rounds} round(s) under "
            f"{name!r}",
            (guide or {}).get(name),
        )

    chosen = [a.analysis] if a.json else list(names)
    rows: list[dict[str, Any]] = []
    found: list[str] = []
    # the analyses share nothing: calibrated side by side, one per core
    for name, (sigma, flag, note) in zip(chosen, map_ordered(solve, chosen)):
        if note:
            found.append(note)
        row = {"noise_multiplier": sigma, **flag, **describe(name)}
        row.update({k: None if sigma is None else f(sigma) for k, f in extra.items()})
        rows.append(row)
    result = {
        **pick(rows, a.analysis),
        "analysis": a.analysis,
        "epsilon": a.epsilon,
        "delta": a.delta,
        "rounds": a.rounds,
    }
    if notes is None:
        notes = basis_notes(event, [a.analysis] if a.json else names)
    return Report(title, result, rows, [*found, *notes])


# -- figures -----------------------------------------------------------------------
def plot_curves(
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
