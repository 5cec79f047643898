"""The ``dpfl`` command line.

``dpfl account SCHEME ...`` and ``dpfl calibrate SCHEME ...`` print a table with
the guarantee's terms and every analysis side by side (``--json`` for scripts,
``--plot FILE`` for ε–δ and ε–rounds curves). Training commands (``train``,
``resume``, ``plot``, ``demo``) load torch lazily, so the accounting commands
work without it.

Errors in the input exit with status 2 and one line naming the parameter.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any, NoReturn

from dpfl.accounting._quiet import quiet as _quiet
from dpfl.errors import DpflError

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


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

    def to_json(self) -> str:
        out = dict(self.result)
        if self.notes:
            out.setdefault("notes", self.notes)
        return json.dumps(out, indent=2, default=_jsonable)

    def to_table(self) -> str:
        lines = [self.title, ""]
        for key in ("unit", "neighbouring", "adversary"):
            if key in self.result:
                lines.append(f"  {key:<13}{self.result[key]}")
        if self.rows:
            cols = list(dict.fromkeys(k for r in self.rows for k in r))
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


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    raise TypeError(f"not JSON serialisable: {x!r}")


def _fmt(v: Any) -> str:
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
def _add_target(p: argparse.ArgumentParser, *, need_epsilon: bool = False) -> None:
    g = p.add_mutually_exclusive_group(required=need_epsilon)
    g.add_argument("--delta", type=float, help="report epsilon at this delta")
    g.add_argument("--epsilon", type=float, help="report delta at this epsilon")


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("--plot", metavar="FILE", help="write epsilon-delta/rounds curves")


# -- random participation ------------------------------------------------------
_RP_TERMS = {
    "sound": "sees each round's noisy aggregate, not who took part (trusted server)",
    "paper": "sees each round's noisy aggregate, not who took part (trusted server)",
    "wcs": "sees each round's noisy aggregate and who took part",
    "ols": "sees each round's noisy aggregate; every client takes part (p = 1)",
    "cs": "central-shuffling reference (not an achievable scheme)",
}


def _rp_args(p: argparse.ArgumentParser, calibrate: bool) -> None:
    p.add_argument(
        "--p", type=float, required=True, help="client participation probability"
    )
    p.add_argument("--q", type=float, required=True, help="record sampling probability")
    p.add_argument("--records-per-client", type=int, required=True, help="d")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument(
        "--analysis", default="sound", choices=("sound", "wcs", "paper", "ols", "cs")
    )
    if calibrate:
        p.add_argument("--epsilon", type=float, required=True)
        p.add_argument("--delta", type=float, required=True)
    else:
        p.add_argument("--noise-multiplier", type=float, required=True)
        _add_target(p)
    _add_common(p)


def _rp_kw(a: argparse.Namespace) -> dict[str, Any]:
    return {
        "participation_probability": a.p,
        "record_probability": a.q,
        "records_per_client": a.records_per_client,
    }


def _rp_terms(analysis: str) -> dict[str, str]:
    return {
        "unit": "record",
        "neighbouring": "add/remove",
        "adversary": _RP_TERMS[analysis],
        "analysis": analysis,
    }


def _rp_value(a: argparse.Namespace, analysis: str, rounds: int) -> dict[str, Any]:
    from dpfl.accounting import participation as rp

    kw = {**_rp_kw(a), "noise_multiplier": a.noise_multiplier, "analysis": analysis}
    if a.epsilon is not None:
        if rounds == 1:
            return {"delta": rp.round_delta(a.epsilon, **kw)}
        b = rp.delta(a.epsilon, rounds=rounds, **kw)
        return {"delta": b.upper, "delta_lower": b.lower}
    delta = 1e-6 if a.delta is None else a.delta
    if rounds == 1:
        return {"epsilon": rp.round_epsilon(delta, **kw), "delta": delta}
    b = rp.epsilon(delta, rounds=rounds, **kw)
    return {"epsilon": b.upper, "epsilon_lower": b.lower, "delta": delta}


def account_random_participation(a: argparse.Namespace) -> Report:
    from dpfl.accounting import participation as rp

    analyses = [a.analysis] if a.json else list(rp.ANALYSES)
    rows = []
    result: dict[str, Any] = {}
    for name in analyses:
        value = _rp_value(a, name, a.rounds)
        rows.append({"analysis": name, **value})
        if name == a.analysis:
            result = {**value, "rounds": a.rounds, **_rp_terms(name)}
    notes = [rp.PAPER_WARNING] if "paper" in analyses else []
    title = (
        f"Random participation: p={a.p}, q={a.q}, d={a.records_per_client}, "
        f"noise multiplier={a.noise_multiplier}, rounds={a.rounds}"
    )

    def plot(path: str) -> None:
        _plot_rp(a, path)

    return Report(title, result, rows, notes, plot)


def calibrate_random_participation(a: argparse.Namespace) -> Report:
    from dpfl.accounting import participation as rp

    analyses = [a.analysis] if a.json else list(rp.ANALYSES)
    rows = []
    result: dict[str, Any] = {}
    notes: list[str] = []
    for name in analyses:
        try:
            sigma: float | None = rp.calibrate_noise_multiplier(
                epsilon=a.epsilon,
                delta=a.delta,
                rounds=a.rounds,
                analysis=name,
                **_rp_kw(a),
            )
            extra: dict[str, Any] = {}
        except rp.CertifiesEverySigma as exc:
            sigma, extra = None, {"certifies_every_sigma": True}
            notes.append(str(exc))
        shown = "any > 0 (not a valid bound)" if sigma is None else sigma
        rows.append({"analysis": name, "noise_multiplier": shown, **extra})
        if name == a.analysis:
            result = {
                "noise_multiplier": sigma,
                **extra,
                "epsilon": a.epsilon,
                "delta": a.delta,
                "rounds": a.rounds,
                **_rp_terms(name),
            }
    if "paper" in analyses:
        notes.append(rp.PAPER_WARNING)
    title = (
        f"Noise for (epsilon={a.epsilon}, delta={a.delta}) after {a.rounds} round(s) "
        f"of random participation: p={a.p}, q={a.q}, d={a.records_per_client}"
    )
    return Report(title, result, rows, notes)


def _plot_curves(
    path: str,
    analyses: Sequence[str],
    epsilon: Callable[[str, float, int], float],
    *,
    delta: float,
    rounds: int,
    title: str,
) -> None:
    """Draw ε vs δ (at ``rounds``) and ε vs rounds (at ``delta``) per analysis."""
    import numpy as np

    from dpfl.plotting import plot_epsilon_curves

    deltas = [float(d) for d in np.logspace(-10, -2, 7)]
    grid = sorted({int(t) for t in np.geomspace(1, max(rounds, 2), 7)})
    plot_epsilon_curves(
        path,
        deltas=deltas,
        epsilon_by_delta={a: [epsilon(a, d, rounds) for d in deltas] for a in analyses},
        rounds=grid,
        epsilon_by_rounds={a: [epsilon(a, delta, t) for t in grid] for a in analyses},
        title=title,
    )


def _plot_rp(a: argparse.Namespace, path: str) -> None:
    from dpfl.accounting import participation as rp

    def eps(analysis: str, delta: float, rounds: int) -> float:
        kw = {**_rp_kw(a), "noise_multiplier": a.noise_multiplier}
        if rounds == 1:
            return rp.round_epsilon(delta, analysis=analysis, **kw)
        return rp.epsilon(delta, rounds=rounds, analysis=analysis, **kw).upper

    analyses = [a.analysis] if a.json else ["sound", "wcs", "ols"]
    _plot_curves(
        path,
        analyses,
        eps,
        delta=a.delta or 1e-6,
        rounds=a.rounds,
        title=f"random participation, sigma={a.noise_multiplier}",
    )


# -- PriFedSync (federated f-DP) -------------------------------------------------
def _pfs_args(p: argparse.ArgumentParser, calibrate: bool) -> None:
    p.add_argument(
        "--noise-multiplier", type=float, required=True, help="the paper's sigma"
    )
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--records-per-client", type=int, required=True)
    p.add_argument("--local-steps", type=int, required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--num-clients", type=int, help="m, for the strong guarantee")
    p.add_argument("--analysis", default="exact", choices=("exact", "clt"))
    p.add_argument(
        "--guarantee", default="weak", choices=("weak", "strong"), help="federated f-DP"
    )
    p.add_argument("--delta", type=float, help="delta for the (epsilon, delta) view")
    _add_common(p)


def account_prifedsync(a: argparse.Namespace) -> Report:
    from dpfl.accounting import fdp, gaussian

    kw = {
        "noise_multiplier": a.noise_multiplier,
        "batch_size": a.batch_size,
        "records_per_client": a.records_per_client,
        "local_steps": a.local_steps,
        "rounds": a.rounds,
    }
    who = (
        "another client, from the helper models it receives (weak federated f-DP)"
        if a.guarantee == "weak"
        else "all other clients jointly (strong federated f-DP)"
    )
    terms = {"unit": "record", "neighbouring": "replace-one", "adversary": who}
    mu = fdp.clt_mu(**kw)
    rows: list[dict[str, Any]] = []
    notes = [
        "clt: the CLT mu is an approximation, not a bound (SPEC 3.6 item 3); "
        "exact: C_{B/n}(G_{1/sigma}) composed K*R times via PLD (certified)."
    ]
    clt_row: dict[str, Any] = {"analysis": "clt", "mu": mu}
    if a.delta is not None:
        clt_row["epsilon"] = gaussian.gdp_epsilon(a.delta, mu=mu)
    exact_row: dict[str, Any] = {"analysis": "exact"}
    if a.analysis == "exact" or not a.json:
        delta = 1e-5 if a.delta is None else a.delta
        b = fdp.exact_epsilon(delta, **kw)
        exact_row.update(
            epsilon=b.upper,
            epsilon_lower=b.lower,
            delta=delta,
            mu_effective=fdp.mu_effective(epsilon=b.upper, delta=delta),
        )
    rows = [clt_row, exact_row]
    if a.guarantee == "strong" and a.num_clients:
        paper_mu = math.sqrt(a.num_clients - 1) * mu
        rows.append({"analysis": "paper strong sqrt(m-1)*mu", "mu": paper_mu})
        notes.append(
            "strong: the paper's sqrt(m-1)*mu_max is valid but loose; the sound strong "
            "guarantee equals the weak one (SPEC 3.6 item 5)."
        )
    chosen = clt_row if a.analysis == "clt" else exact_row
    result = {**{k: v for k, v in chosen.items() if k != "analysis"}, **terms}
    result["analysis"] = a.analysis
    title = (
        f"PriFedSync: sigma={a.noise_multiplier}, B={a.batch_size}, "
        f"n={a.records_per_client}, K={a.local_steps}, R={a.rounds}"
    )
    return Report(title, result, rows, notes)


# -- client-level DP-FedAvg ---------------------------------------------------------
_FEDAVG_TERMS = {
    "paper": ("add/remove", "moments accountant, cohort read as Poisson m/K (Geyer)"),
    "pld": ("add/remove", "PLD, cohort read as Poisson m/K"),
    "sound": ("replace-one", "fixed-size cohort (WOR), RDP"),
    "sound-pld": (
        "replace-one",
        "fixed-size cohort (WOR), PLD of C_{m/K}(G_{2/sigma})",
    ),
}


def _fedavg_args(p: argparse.ArgumentParser, calibrate: bool) -> None:
    p.add_argument("--clients", type=int, required=True, help="K")
    p.add_argument("--cohort", type=int, required=True, help="m clients per round")
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--analysis", default="sound", choices=tuple(_FEDAVG_TERMS))
    if calibrate:
        p.add_argument("--epsilon", type=float, required=True)
        p.add_argument("--delta", type=float, required=True)
    else:
        p.add_argument("--noise-multiplier", type=float, required=True)
        p.add_argument("--threshold", type=float, help="Q: report the stop round")
        _add_target(p)
    _add_common(p)


def _fedavg_terms(analysis: str) -> dict[str, str]:
    rel, how = _FEDAVG_TERMS[analysis]
    return {
        "unit": "client",
        "neighbouring": rel,
        "adversary": "sees every released global model",
        "analysis": analysis,
        "method": how,
    }


def account_dp_fedavg(a: argparse.Namespace) -> Report:
    from dpfl.accounting import rdp

    kw = {
        "clients": a.clients,
        "cohort_sizes": a.cohort,
        "noise_multipliers": a.noise_multiplier,
        "rounds": a.rounds,
    }
    rows = []
    result: dict[str, Any] = {}
    for name in [a.analysis] if a.json else list(_FEDAVG_TERMS):
        row: dict[str, Any] = {"analysis": name}
        if a.epsilon is not None:
            row["delta"] = rdp.dp_fedavg_delta(epsilon=a.epsilon, analysis=name, **kw)
        else:
            delta = 1e-5 if a.delta is None else a.delta
            row["epsilon"] = rdp.dp_fedavg_epsilon(delta=delta, analysis=name, **kw)
            row["delta"] = delta
        if a.threshold is not None and a.epsilon is not None:
            row["stop_round"] = rdp.dp_fedavg_stop_round(
                epsilon=a.epsilon,
                threshold=a.threshold,
                clients=a.clients,
                cohort_sizes=a.cohort,
                noise_multipliers=a.noise_multiplier,
                max_rounds=max(a.rounds, 10_000),
                analysis=name,
            )
        rows.append(row)
        if name == a.analysis:
            result = {**{k: v for k, v in row.items() if k != "analysis"}}
            result.update(_fedavg_terms(name), rounds=a.rounds)
    notes = [
        "paper/pld read the fixed-size cohort as Poisson sampling: not a valid bound "
        "for fixed cohorts (SPEC 4.3 item 1); sound/sound-pld account it as sampled "
        "without replacement under replace-one."
    ]
    title = (
        f"Client-level DP-FedAvg: K={a.clients}, m={a.cohort}, "
        f"noise multiplier={a.noise_multiplier}, rounds={a.rounds}"
    )

    def eps(analysis: str, delta: float, rounds: int) -> float:
        return rdp.dp_fedavg_epsilon(
            delta=delta,
            clients=a.clients,
            cohort_sizes=a.cohort,
            noise_multipliers=a.noise_multiplier,
            rounds=rounds,
            analysis=analysis,
        )

    def plot(path: str) -> None:
        _plot_curves(
            path,
            [a.analysis] if a.json else list(_FEDAVG_TERMS),
            eps,
            delta=a.delta or 1e-5,
            rounds=a.rounds,
            title=f"DP-FedAvg, K={a.clients}, m={a.cohort}",
        )

    return Report(title, result, rows, notes, plot)


def calibrate_dp_fedavg(a: argparse.Namespace) -> Report:
    from dpfl.accounting import rdp

    rows = []
    result: dict[str, Any] = {}
    for name in [a.analysis] if a.json else list(_FEDAVG_TERMS):
        sigma = rdp.calibrate_dp_fedavg(
            epsilon=a.epsilon,
            delta=a.delta,
            clients=a.clients,
            cohort=a.cohort,
            rounds=a.rounds,
            analysis=name,
        )
        rows.append({"analysis": name, "noise_multiplier": sigma})
        if name == a.analysis:
            result = {"noise_multiplier": sigma, "epsilon": a.epsilon, "delta": a.delta}
            result.update(_fedavg_terms(name), rounds=a.rounds)
    title = (
        f"Noise for client-level (epsilon={a.epsilon}, delta={a.delta}) after "
        f"{a.rounds} rounds of DP-FedAvg: K={a.clients}, m={a.cohort}"
    )
    return Report(title, result, rows)


# -- MS-PAFL ------------------------------------------------------------------------
def _mspafl_args(p: argparse.ArgumentParser, calibrate: bool) -> None:
    p.add_argument("--clients", type=int, default=100, help="K")
    p.add_argument("--probability", type=float, default=0.5, help="check-in p")
    p.add_argument("--local-epsilon", type=float, default=0.5, help="per-round LDP eps")
    p.add_argument("--local-delta", type=float, default=1e-5)
    p.add_argument("--batch-size", type=int, default=32, help="b")
    p.add_argument("--dataset-size", type=int, default=325, help="n_k")
    p.add_argument("--local-steps", type=int, default=1, help="E")
    p.add_argument("--replacement", action="store_true", help="WR subsampling")
    p.add_argument("--xi", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--delta-slack", type=float, default=1e-5)
    p.add_argument(
        "--analysis",
        default="sound",
        choices=("sound", "central", "local", "global"),
    )
    _add_common(p)


def account_ms_pafl(a: argparse.Namespace) -> Report:
    from dpfl.accounting import checkin, gaussian

    sigma = gaussian.calibrate_analytic(
        epsilon=a.local_epsilon, delta=a.local_delta, sensitivity=2.0
    )
    gamma = checkin.subsampling_ratio(
        batch_size=a.batch_size,
        dataset_size=a.dataset_size,
        replacement=a.replacement,
        local_steps=a.local_steps,
    )
    joined = max(1, round(a.probability * a.rounds))
    sound = checkin.sound_client(
        noise_multiplier=sigma, clip=1.0, rounds_joined=joined, delta=a.delta_slack
    )
    eps_c, delta_c = checkin.central_round(
        epsilon=a.local_epsilon,
        delta=a.local_delta,
        clients=a.clients,
        probability=a.probability,
        gamma=gamma,
        xi=a.xi,
    )
    eps_h, delta_h = checkin.central_round(
        epsilon=a.local_epsilon,
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
        delta=a.delta_slack,
    )
    glob = checkin.global_total(
        eps_max=eps_c, delta_max=delta_c, rounds=a.rounds, delta_slack=a.delta_slack
    )
    rows = [
        {
            "analysis": "sound",
            "epsilon": sound["epsilon"],
            "delta": a.delta_slack,
            "scope": f"client vs parameter server, {joined} joined rounds",
        },
        {
            "analysis": "central (Thm 2, exact tail)",
            "epsilon": eps_c,
            "delta": delta_c,
            "scope": "one round, global model",
        },
        {
            "analysis": "central (Thm 2, Hoeffding)",
            "epsilon": eps_h,
            "delta": delta_h,
            "scope": "one round, global model (paper)",
        },
        {
            "analysis": "local (Thm 3)",
            "epsilon": local["epsilon"],
            "delta": a.delta_slack,
            "scope": "local total (paper; validity "
            + ("holds" if local["valid"] else "fails")
            + ")",
        },
        {
            "analysis": "global (Thm 4)",
            "epsilon": glob[0],
            "delta": glob[1],
            "scope": f"{a.rounds} rounds, global model",
        },
    ]
    pick = {"sound": 0, "central": 1, "local": 3, "global": 4}[a.analysis]
    chosen = rows[pick]
    adversary = (
        "the parameter server (sees every noisy public submodel and who checked in)"
        if a.analysis == "sound"
        else "parties that see the global public model only (not who checked in)"
    )
    result = {
        "epsilon": chosen["epsilon"],
        "delta": chosen["delta"],
        "noise_multiplier": sigma,
        "gamma": gamma,
        "unit": "record (and client: the public part is output-clipped)",
        "neighbouring": "replace-one",
        "adversary": adversary,
        "analysis": a.analysis,
    }
    notes = [
        "The paper's gamma amplification ignores the hidden private submodel, which "
        "is trained on earlier subsamples (SPEC 1.3 item 2); sound uses no "
        "amplification and the realised number of joined rounds.",
    ]
    title = (
        f"MS-PAFL: K={a.clients}, p={a.probability}, local (eps, delta)=("
        f"{a.local_epsilon}, {a.local_delta}), b={a.batch_size}, n={a.dataset_size}, "
        f"R={a.rounds}"
    )
    return Report(title, result, rows, notes)


# -- LOCKS --------------------------------------------------------------------------
def _locks_args(p: argparse.ArgumentParser, calibrate: bool) -> None:
    p.add_argument("--q1", type=float, required=True, help="first-stage probability")
    p.add_argument(
        "--max-p2", type=float, default=1.0, help="largest stage-2 probability"
    )
    p.add_argument("--norm-noise-multiplier", type=float, required=True)
    p.add_argument("--update-noise-multiplier", type=float, required=True)
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument(
        "--norm-rounds", type=int, help="N1 for the server view (default q1*T)"
    )
    p.add_argument("--update-rounds", type=int, help="N2 for the server view")
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--analysis", default="server", choices=("server", "observer"))
    _add_common(p)


def account_locks(a: argparse.Namespace) -> Report:
    from dpfl.accounting import rdp

    n1 = a.norm_rounds if a.norm_rounds is not None else math.ceil(a.q1 * a.rounds)
    n2 = (
        a.update_rounds
        if a.update_rounds is not None
        else math.ceil(a.q1 * a.max_p2 * a.rounds)
    )
    server = rdp.locks_server_view(
        norm_noise_multiplier=a.norm_noise_multiplier,
        update_noise_multiplier=a.update_noise_multiplier,
        norm_rounds=n1,
        update_rounds=n2,
        delta=a.delta,
    )
    observer = rdp.locks_observer_view(
        q1=a.q1,
        max_p2=a.max_p2,
        norm_noise_multiplier=a.norm_noise_multiplier,
        update_noise_multiplier=a.update_noise_multiplier,
        rounds=a.rounds,
        delta=a.delta,
    )
    rows = [
        {
            "analysis": "server",
            "epsilon": server["epsilon"],
            "mu": server.get("mu"),
            "scope": f"server view, N1={n1}, N2={n2}",
        },
        {
            "analysis": "observer",
            "epsilon": observer["epsilon"],
            "scope": "observer of the model only, amplified by q1",
        },
    ]
    for key in ("epsilon_pld", "epsilon_rdp"):
        if key in observer:
            rows.append(
                {
                    "analysis": f"observer ({key[8:]}, SPEC 2.2)",
                    "epsilon": observer[key],
                    "scope": "stages priced separately",
                }
            )
    chosen = server if a.analysis == "server" else observer
    result = {
        "epsilon": chosen["epsilon"],
        "delta": a.delta,
        "unit": "client",
        "neighbouring": "add/remove",
        "adversary": "the server (sees who sent what)"
        if a.analysis == "server"
        else "sees the released models only",
        "analysis": a.analysis,
    }
    title = (
        f"LOCKS: q1={a.q1}, sigma_n={a.norm_noise_multiplier}, "
        f"sigma_g={a.update_noise_multiplier}, T={a.rounds}"
    )
    return Report(title, result, rows)


# -- Gaussian mechanism ---------------------------------------------------------------
def _gauss_args(p: argparse.ArgumentParser, calibrate: bool) -> None:
    p.add_argument("--sensitivity", type=float, default=1.0)
    if calibrate:
        p.add_argument("--epsilon", type=float, required=True)
        p.add_argument("--delta", type=float, required=True)
    else:
        p.add_argument("--noise-multiplier", type=float, required=True)
        _add_target(p)
    p.add_argument("--analysis", default="analytic", choices=("analytic", "classic"))
    _add_common(p)


def _gauss_terms(analysis: str) -> dict[str, str]:
    return {
        "unit": "record",
        "neighbouring": "sensitivity-bounded change",
        "adversary": "sees the noisy output",
        "analysis": analysis,
    }


def account_gaussian(a: argparse.Namespace) -> Report:
    from dpfl.accounting import gaussian

    kw = {"noise_multiplier": a.noise_multiplier, "sensitivity": a.sensitivity}
    if a.epsilon is not None:
        value = {"delta": gaussian.delta_for_epsilon(a.epsilon, **kw)}
    else:
        delta = 1e-5 if a.delta is None else a.delta
        value = {"epsilon": gaussian.epsilon_for_delta(delta, **kw), "delta": delta}
    value["mu"] = gaussian.mu_from_noise(**kw)
    result = {**value, **_gauss_terms("analytic")}
    return Report("Gaussian mechanism", result, [{"analysis": "analytic", **value}])


def calibrate_gaussian(a: argparse.Namespace) -> Report:
    from dpfl.accounting import gaussian

    exact = gaussian.calibrate_analytic(
        epsilon=a.epsilon, delta=a.delta, sensitivity=a.sensitivity
    )
    classic, warning = gaussian.classic_sigma(
        epsilon=a.epsilon, delta=a.delta, sensitivity=a.sensitivity
    )
    rows = [
        {"analysis": "analytic", "noise_multiplier": exact},
        {"analysis": "classic", "noise_multiplier": classic},
    ]
    sigma = exact if a.analysis == "analytic" else classic
    result = {"noise_multiplier": sigma, **_gauss_terms(a.analysis)}
    return Report(
        "Gaussian mechanism calibration", result, rows, [warning] if warning else []
    )


SCHEMES: dict[str, tuple[Callable[..., None], Callable | None, Callable | None]] = {
    "random-participation": (
        _rp_args,
        account_random_participation,
        calibrate_random_participation,
    ),
    "prifedsync": (_pfs_args, account_prifedsync, None),
    "dp-fedavg": (_fedavg_args, account_dp_fedavg, calibrate_dp_fedavg),
    "ms-pafl": (_mspafl_args, account_ms_pafl, None),
    "locks": (_locks_args, account_locks, None),
    "gaussian": (_gauss_args, account_gaussian, calibrate_gaussian),
}


# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """Return the ``dpfl`` argument parser."""
    parser = _Parser(
        prog="dpfl",
        description="Differentially private federated learning: account, calibrate, "
        "train.",
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
            sp = schemes.add_parser(name)
            add_args(sp, mode == "calibrate")
            sp.set_defaults(handler=handler)
    try:
        from dpfl.experiments.cli import add_subcommands
    except ImportError:  # training extras not installed
        pass
    else:
        add_subcommands(sub)
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
    try:
        with _quiet():
            outcome = args.handler(args)
            if isinstance(outcome, Report):
                print(
                    outcome.to_json()
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
        print(f"dpfl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dpfl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
