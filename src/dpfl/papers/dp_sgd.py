"""DP-SGD (Abadi et al. 2016): ``dpfl account|calibrate dp-sgd``.

The question people bring from Opacus or dp_accounting: a sampling rate q
(or a batch of B of n records), a noise multiplier σ, a number of steps (or
epochs), δ. Two samplers:

``--sampling poisson`` (default)
    Each record joins each step independently with probability q (Opacus's
    default); add/remove of one record. The event is a
    :class:`~dpfl.accounting.events.PoissonSampled` Gaussian.
``--sampling fixed``
    A uniform batch of exactly B of the n records each step (sampling without
    replacement, a shuffled loader's batch); replace-one of a record, the
    dataset size public. The event is a
    :class:`~dpfl.accounting.events.WithoutReplacement` Gaussian (the clipped
    sum's sensitivity is 2C under replace-one).

Both are priced by the :class:`~dpfl.accounting.accountant.Accountant` (the
``exact`` analysis, a certified privacy-loss distribution: the tightest
proven, and the default), as a run's ledger prices them. Beside it, for
comparison: ``rdp`` (proven, looser: Rényi DP with dp_accounting's
conversion, the analysis of Opacus's ``rdp`` accountant: Mironov, Talwar &
Zhang 2019 for Poisson; Wang, Balle & Kasiviswanathan 2019 for the fixed
batch), ``gdp-clt`` (invalid: the central-limit approximation of Bu, Dong,
Long & Su 2020, Opacus's ``gdp`` accountant, an estimate rather than a
bound) and, for a fixed batch, ``as-poisson`` (invalid: the batch read as
Poisson sampling at q = B/n under add/remove, which is what an accountant for
Poisson sampling reports when the loader draws fixed batches).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

import dpfl.papers.report as report
from dpfl.errors import DpflError
from dpfl.papers.base import Paper, add_budget, add_common
from dpfl.papers.report import Report

__all__ = ["PAPER", "account", "calibrate", "event", "steps"]

#: Every analysis ``dpfl account dp-sgd`` shows, with its status.
ANALYSES: dict[str, str] = {
    "exact": "proven",
    "rdp": "proven",
    "gdp-clt": "invalid",
    "as-poisson": "invalid",
}

#: The exact analysis's bracket, relative (0.01%: the figures other
#: accountants print are compared to 4 or 5 significant figures).
TOLERANCE = 1e-4

#: What each comparison analysis rests on (the table's notes).
_BASIS = {
    "rdp": "Renyi DP composed over the steps and converted to (epsilon, delta) "
    "by dp_accounting (Balle et al. 2020's conversion): a valid bound, looser "
    "than the exact PLD (Opacus's 'rdp' accountant; Mironov, Talwar & Zhang "
    "2019 for Poisson, Wang, Balle & Kasiviswanathan 2019 for a fixed batch "
    "under replace-one)",
    "gdp-clt": "the central limit theorem of Bu, Dong, Long & Su (2020): "
    "mu = q sqrt(T (exp(1/sigma^2) - 1)), then mu-GDP's (epsilon, delta) "
    "(Opacus's 'gdp' accountant). An approximation as T grows, not a bound: "
    "it understates epsilon, most at few steps and large q",
    "as-poisson": "the fixed batch read as Poisson sampling at q = B/n under "
    "add/remove of a record, priced exactly: what a Poisson accountant reports "
    "for a loader that draws fixed batches. Not valid for that sampler "
    "(neither the sampler nor the neighbouring relation is the one run)",
}


def _flags(p: argparse.ArgumentParser, calibrate: bool) -> None:
    p.add_argument(
        "--sampling",
        choices=("poisson", "fixed"),
        default="poisson",
        help="poisson: each record joins each step w.p. q (add/remove of a "
        "record); fixed: a uniform batch of --batch-size of --dataset-size "
        "records, without replacement (replace-one of a record)",
    )
    p.add_argument("--q", type=float, help="Poisson sampling rate (or give B and n)")
    p.add_argument(
        "--batch-size", type=int, help="B: the batch (expected batch, for Poisson)"
    )
    p.add_argument("--dataset-size", type=int, help="n: records in the data set")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--steps", type=int, help="T: noisy steps")
    g.add_argument(
        "--epochs",
        type=float,
        help="passes over the data: T = ceil(epochs / q), q = B/n",
    )
    p.add_argument(
        "--analysis",
        default="exact",
        choices=tuple(ANALYSES),
        help="the analysis --json reports (default exact, the tightest proven)",
    )
    if not calibrate:
        p.add_argument(
            "--noise-multiplier",
            type=float,
            required=True,
            help="sigma: noise std on the sum of clipped gradients, divided by the "
            "clip",
        )
    add_budget(p, calibrate)
    add_common(p, plot=not calibrate)


def _rate(a: argparse.Namespace) -> float:
    """The sampling rate: q, or B/n."""
    if a.sampling == "fixed":
        if a.batch_size is None or a.dataset_size is None:
            raise DpflError(
                "--sampling fixed needs --batch-size and --dataset-size (B of n)"
            )
        if a.q is not None:
            raise DpflError("--q is for --sampling poisson; a fixed batch is B/n")
        if a.batch_size > a.dataset_size:
            raise DpflError(
                f"batch_size must be <= dataset_size ({a.dataset_size}); got "
                f"{a.batch_size}"
            )
        return float(a.batch_size / a.dataset_size)
    if a.q is not None:
        if a.batch_size is not None or a.dataset_size is not None:
            raise DpflError("give either --q or --batch-size and --dataset-size")
        return float(a.q)
    if a.batch_size is None or a.dataset_size is None:
        raise DpflError(
            "--sampling poisson needs --q, or --batch-size and --dataset-size"
        )
    if a.batch_size > a.dataset_size:
        raise DpflError(
            f"batch_size must be <= dataset_size ({a.dataset_size}); got {a.batch_size}"
        )
    return float(a.batch_size / a.dataset_size)


def steps(a: argparse.Namespace) -> int:
    """T: ``--steps``, or ``ceil(epochs / q)`` (one epoch is 1/q steps)."""
    from dpfl._validate import MAX_ROUNDS

    if a.steps is not None:
        return int(a.steps)
    epochs = float(a.epochs)
    t = math.ceil(epochs / _rate(a) - 1e-9)
    if t > MAX_ROUNDS:
        raise DpflError(
            f"epochs gives {t} steps (epochs / q); at most {MAX_ROUNDS} are "
            "accounted in bounded time"
        )
    return max(1, t)


def event(a: argparse.Namespace, sigma: float, *, poisson: bool = False) -> Any:
    """One step at noise multiplier ``sigma``, from the flags.

    ``poisson``: a fixed batch read as Poisson sampling at B/n (``as-poisson``).
    """
    from dpfl.accounting import events as ev

    if a.sampling == "fixed" and not poisson:
        return ev.WithoutReplacement(a.batch_size, a.dataset_size, ev.Gaussian(sigma))
    return ev.PoissonSampled(_rate(a), ev.Gaussian(sigma))


def _names(a: argparse.Namespace) -> list[str]:
    names = ["exact", "rdp"]
    names.append("as-poisson" if a.sampling == "fixed" else "gdp-clt")
    if a.analysis not in names:
        raise DpflError(
            f"analysis {a.analysis!r} is not one of --sampling {a.sampling}'s "
            f"analyses {names}"
        )
    return names


def _rdp_accountant(a: argparse.Namespace, sigma: float, t: int) -> Any:
    """dp_accounting's RDP accountant after ``t`` steps at ``sigma``."""
    from dp_accounting import dp_event
    from dp_accounting.privacy_accountant import NeighboringRelation
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    from dpfl.accounting._quiet import quiet

    if a.sampling == "fixed":  # replace-one moves the clipped sum by 2C: σ/2
        acc = rdp.RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE)
        one: Any = dp_event.SampledWithoutReplacementDpEvent(
            a.dataset_size, a.batch_size, dp_event.GaussianDpEvent(sigma / 2.0)
        )
    else:
        acc = rdp.RdpAccountant()
        one = dp_event.PoissonSampledDpEvent(_rate(a), dp_event.GaussianDpEvent(sigma))
    with quiet():
        acc.compose(dp_event.SelfComposedDpEvent(one, t))
    return acc


def _clt_mu(a: argparse.Namespace, sigma: float, t: int) -> float:
    """Bu et al.'s CLT: μ = q √(T (e^{1/σ²} − 1)) (Poisson sampling)."""
    return _rate(a) * math.sqrt(t * math.expm1(sigma**-2))


def _price(
    a: argparse.Namespace,
    name: str,
    sigma: float,
    t: int,
    *,
    delta: float | None = None,
    epsilon: float | None = None,
) -> dict[str, Any]:
    """ε at δ (or δ at ε) after ``t`` steps at ``sigma`` under ``name``."""
    from dpfl.accounting import gaussian

    d = 0.0 if delta is None else float(delta)
    if name in ("exact", "as-poisson"):
        from dpfl.accounting.accountant import Accountant

        e = event(a, sigma, poisson=name == "as-poisson")
        acc = Accountant(tolerance=TOLERANCE).compose(e, t)
        if epsilon is None:
            b = acc.epsilon(d)
            return {"epsilon": b.upper, "epsilon_lower": b.lower, "delta": delta}
        b = acc.delta(epsilon)
        return {"delta": b.upper, "delta_lower": b.lower, "epsilon": epsilon}
    if name == "rdp":
        rdp = _rdp_accountant(a, sigma, t)
        if epsilon is None:
            return {"epsilon": float(rdp.get_epsilon(d)), "delta": delta}
        return {"delta": float(rdp.get_delta(epsilon)), "epsilon": epsilon}
    mu = _clt_mu(a, sigma, t)
    if epsilon is None:
        return {"epsilon": gaussian.gdp_epsilon(d, mu=mu), "delta": delta}
    return {"delta": gaussian.gdp_delta(epsilon, mu=mu), "epsilon": epsilon}


def _terms(a: argparse.Namespace, name: str) -> dict[str, Any]:
    """The row's guarantee terms and status (the unit is one record)."""
    poisson = a.sampling == "poisson" or name == "as-poisson"
    terms = report.terms(event(a, 1.0, poisson=name == "as-poisson"), None)
    terms["unit"] = "record"
    if poisson:
        terms["neighbouring"] = "add/remove of one record"
    return {**terms, "analysis": name, "status": ANALYSES[name]}


def _notes(a: argparse.Namespace, names: list[str], t: int) -> list[str]:
    how = (
        f"{t} steps, each a uniform batch of {a.batch_size} of {a.dataset_size} records"
        if a.sampling == "fixed"
        else f"{t} steps, each record sampled w.p. q = {_rate(a):.6g}"
    )
    out = [how]
    for name in names:
        if name == "exact":
            out += report.basis_notes(event(a, 1.0), ["exact"])
        else:
            out.append(f"{name} ({ANALYSES[name]}): {_BASIS[name]}")
    return out


def account(a: argparse.Namespace) -> Report:
    """``dpfl account dp-sgd``: ε at δ (or δ at ε) after T steps, per analysis."""
    _rate(a)  # the sampler's flags, checked first
    t = steps(a)
    names = _names(a)
    target: dict[str, float] = (
        {"epsilon": a.epsilon} if a.epsilon is not None else {"delta": a.delta}
    )
    rows = [
        {**_price(a, n, a.noise_multiplier, t, **target), **_terms(a, n)}
        for n in ([a.analysis] if a.json else names)
    ]
    result = {
        **report.pick(rows, a.analysis),
        "analysis": a.analysis,
        "steps": t,
        "sampling_rate": _rate(a),
    }

    def curve(name: str, deltas: Any, rounds: int) -> list[float]:
        if name in ("exact", "as-poisson"):
            from dpfl.accounting.accountant import Accountant

            e = event(a, a.noise_multiplier, poisson=name == "as-poisson")
            acc = Accountant(tolerance=TOLERANCE).compose(e, rounds)
            return [acc.epsilon(d).upper for d in deltas]
        return [
            _price(a, name, a.noise_multiplier, rounds, delta=d)["epsilon"]
            for d in deltas
        ]

    def plot(path: str) -> None:
        report.plot_curves(
            path,
            event(a, a.noise_multiplier),
            rows,
            curve,
            delta=a.delta or a.default_delta,
            rounds=t,
            title=f"DP-SGD ({a.sampling} sampling): q={_rate(a):.4g}, "
            f"σ={a.noise_multiplier}",
        )

    shown = [str(r["analysis"]) for r in rows]
    return Report(
        f"DP-SGD, {a.sampling} sampling", result, rows, _notes(a, shown, t), plot
    )


def calibrate(a: argparse.Namespace) -> Report:
    """``dpfl calibrate dp-sgd``: σ for (ε, δ) after T steps, per analysis.

    Every analysis is solved for its smallest σ meeting the target; the
    exact one by the Accountant's certified bound (as a run's calibration).
    """
    _rate(a)  # the sampler's flags, checked first
    t = steps(a)
    names = _names(a)
    b = report.with_(a, rounds=t)

    def given(name: str) -> Callable[[float], float]:
        return lambda sigma: float(_price(a, name, sigma, t, delta=a.delta)["epsilon"])

    rep = report.calibrate(
        b,
        f"DP-SGD calibration, {a.sampling} sampling",
        names,
        lambda sigma: event(a, sigma),
        epsilon_of={n: given(n) for n in names if n not in ("exact",)},
        describe=lambda name: _terms(a, name),
        notes=_notes(a, [a.analysis] if a.json else names, t),
    )
    rep.result.pop("rounds", None)
    rep.result.update(steps=t, sampling_rate=_rate(a))
    return rep


def _analyses() -> list[tuple[str, str]]:
    return list(ANALYSES.items())


PAPER = Paper(
    name="dp-sgd",
    summary="DP-SGD: Poisson rate q (or a fixed batch of B of n), sigma, steps "
    "or epochs (Abadi et al. 2016), the tightest proven analysis beside "
    "Opacus's",
    flags=_flags,
    account=account,
    calibrate=calibrate,
    analyses=_analyses,
)
