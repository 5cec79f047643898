"""LOCKS: two-stage norm-proportional client sampling with client-side noise.

Each round a client is picked with probability q1 and sends a noisy norm;
the server then picks, with a probability of at most max p2 that grows with
the norm, the clients that also send a noisy update. The privacy unit is one
client. This module is everything the paper adds at the front: the flags of
``dpfl account|calibrate locks`` and their event (a
:class:`~dpfl.accounting.events.TwoStage`), priced by the Accountant for
the server and for an observer of the models
(:data:`dpfl.accounting.schemes.TWO_STAGE`), with what a client that sent N1
norms and N2 updates in a run has spent; and its reproduction (``dpfl
reproduce locks``): the server's view, its figure, the sampling
experiment (Figure 1) and the stale norm against the current one.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import dpfl.papers.report as report
from dpfl.errors import DpflError
from dpfl.experiments.reproduce import (
    Experiment,
    Figure,
    Printed,
    Reproduction,
    Table,
    axes,
)
from dpfl.papers.base import Paper, add_budget, add_common
from dpfl.papers.report import Report

__all__ = [
    "PAPER",
    "account",
    "calibrate",
    "event",
    "stale_overrides",
    "uniform_overrides",
]


# ---------------------------------------------------------------------------
# dpfl account / calibrate locks
# ---------------------------------------------------------------------------
def _flags(p: argparse.ArgumentParser, calibrate: bool) -> None:
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
    add_budget(p, calibrate, delta_only=not calibrate)
    add_common(p, plot=not calibrate)


def event(a: argparse.Namespace, sigma: float) -> Any:
    """One round at update noise multiplier ``sigma``, from the flags."""
    from dpfl._validate import check_norm_noise
    from dpfl.accounting import events as ev

    sigma_n = check_norm_noise(a.norm_noise_ratio, sigma)
    return ev.TwoStage(a.q1, 1, a.max_p2, ev.Gaussian(sigma_n), ev.Gaussian(sigma))


def account(a: argparse.Namespace) -> Report:
    """``dpfl account locks``: both adversaries, and a client's realised spend."""
    from dpfl.accounting import rdp

    e = event(a, a.noise_multiplier)
    rows = []
    for name in ("server", "observer"):
        rows.append(
            {
                **report.bound(e, a.rounds, name, delta=a.delta),
                **report.terms(e, name),
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
                **report.terms(e, "server"),
                "analysis": "server (realised)",
                "scope": f"a run in which the client sent N1={a.norm_rounds} norms "
                f"and N2={n2} updates (a statement about that run)",
            }
        )
    elif a.update_rounds is not None:
        raise DpflError("--update-rounds needs --norm-rounds (N2 <= N1)")
    result = {**report.pick(rows, a.analysis), "analysis": a.analysis}
    title = (
        f"LOCKS: q1={a.q1}, max p2={a.max_p2}, sigma_g={a.noise_multiplier}, "
        f"sigma_n={a.norm_noise_ratio * a.noise_multiplier:g}, T={a.rounds}"
    )

    def plot(path: str) -> None:
        report.plot_curves(
            path,
            e,
            [r for r in rows if r["analysis"] in ("server", "observer")],
            delta=a.delta,
            rounds=a.rounds,
            title=title,
        )

    notes = report.basis_notes(e, ["server", "observer"])
    return Report(title, result, rows, notes, plot)


def calibrate(a: argparse.Namespace) -> Report:
    """``dpfl calibrate locks``: σ_g (and σ_n) for each adversary."""
    # both adversaries are priced alike (the observer is bounded by the server)
    title = (
        f"LOCKS noise for (epsilon={a.epsilon}, delta={a.delta}) after {a.rounds} "
        f"rounds: q1={a.q1}, max p2={a.max_p2}, sigma_n/sigma_g={a.norm_noise_ratio}"
    )
    return report.calibrate(
        a,
        title,
        ["server", "observer"],
        lambda sigma: event(a, sigma),
        notes=report.basis_notes(event(a, 1.0), ["server", "observer"]),
        norm_noise_multiplier=lambda sigma: a.norm_noise_ratio * sigma,
    )


def _analyses() -> list[tuple[str, str]]:
    from dpfl.accounting import events as ev

    g = ev.Gaussian(1.0)
    return report.scheme_analyses(ev.TwoStage(0.5, 1, 0.5, g, g))


# ---------------------------------------------------------------------------
# dpfl reproduce locks
# ---------------------------------------------------------------------------
def _locks() -> list[Table]:
    from dpfl.accounting import rdp

    rows = []
    for sn, sg, n1, n2 in ((5.0, 1.5, 30, 10), (5.0, 1.0, 10, 5), (10.0, 2.0, 50, 20)):
        s = rdp.locks_server_view(
            norm_noise_multiplier=sn,
            update_noise_multiplier=sg,
            norm_rounds=n1,
            update_rounds=n2,
            delta=1e-5,
        )
        rows.append([sn, sg, n1, n2, s.get("mu"), s["epsilon"]])
    t1 = Table(
        "LOCKS, server view (sees who sent what): exact Gaussian composition, δ = 1e-5",
        ["σ_n", "σ_g", "N1 (norm rounds)", "N2 (update rounds)", "μ", "ε"],
        rows,
        [
            "The paper's expectation over sampling of per-step RDP (Theorem 5.3) is "
            "not a bound; dpfl uses the realised counts from the ledger.",
            "The paper's noise multipliers (TF-Privacy RDP searches) and ε values "
            "are lost from its text, so no printed value can be compared.",
        ],
    )
    from dpfl.accounting import events as ev
    from dpfl.accounting.accountant import Accountant

    event = ev.TwoStage(0.1, 1, 0.5, ev.Gaussian(5.0), ev.Gaussian(1.0))
    t2 = Table(
        "LOCKS before a run: q1 = 0.1, max p2 = 0.5, σ_n = 5, σ_g = 1, T = 100, "
        "δ = 1e-5",
        ["adversary", "ε"],
        [
            [
                "the server (sees who sent what)",
                Accountant("server").compose(event, 100).epsilon(1e-5).upper,
            ],
            [
                "observers of the released models",
                Accountant("observer").compose(event, 100).epsilon(1e-5).upper,
            ],
        ],
        [
            "Each round is priced as what the server sees: w.p. q1 a noisy norm, "
            "w.p. at most q1·max p2 also a noisy update, and who took part. The "
            "observer of the model gets the same bound: the noise is added by the "
            "clients, so the aggregate's noise level reveals who took part.",
        ],
    )
    return [t1, t2]


def _locks_figures() -> list[Figure]:
    def draw(fig: Any) -> None:
        from dpfl.accounting import rdp

        (ax,) = axes(fig, 1)
        rounds = [10, 25, 50, 100, 150, 200, 300]
        q1 = 0.2
        for label, sn, p2 in (
            ("LOCKS (σ_n = 4σ_g, E[p2] = 0.5)", 6.0, 0.5),
            ("uniform (no norms, p2 = 1)", None, 1.0),
        ):
            eps = []
            for t in rounds:
                n1 = math.ceil(q1 * t)
                n2 = math.ceil(q1 * p2 * t)
                eps.append(
                    rdp.locks_server_view(
                        norm_noise_multiplier=sn if sn is not None else 1e9,
                        update_noise_multiplier=1.5,
                        norm_rounds=n1,
                        update_rounds=n2,
                        delta=1e-5,
                    )["epsilon"]
                )
            ax.plot(rounds, eps, marker="o", label=label)
        ax.set_xlabel("rounds T")
        ax.set_ylabel("ε against the server (δ = 1e-5)")
        ax.set_title("σ_g = 1.5, q1 = 0.2; expected participation (not a bound)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")

    return [
        Figure(
            "locks-epsilon-vs-rounds",
            "What a typical client pays the server over T rounds: LOCKS (noisy norms "
            "each time it is drawn in stage 1, an update when drawn in stage 2) "
            "against uniform sampling with the same client noise. Counts are the "
            "expected ones (a run's ledger uses the realised counts).",
            draw,
            size=(6.0, 4.2),
        )
    ]


#: Figure 1 draws LOCKS against uniform sampling on MNIST; every number of
#: the paper's experiments (K, E, the noise multipliers) is lost from its text.
PRINTED = {
    v: Printed(None, f"Figure 1 ({v}, MNIST; a curve, its numbers lost from the text)")
    for v in ("LOCKS", "uniform")
}


def _locks_printed(why: str) -> tuple[tuple[str, Printed, str], ...]:
    return tuple((v, PRINTED[v], why) for v in ("LOCKS", "uniform"))


#: The LOCKS preset and its uniform-sampling baseline (Figure 1) at the
#: default scale; the baseline variant is what the second changes in the first.
LOCKS_PRESET, UNIFORM_PRESET = "locks-fmnist", "locks-fmnist-uniform"


def uniform_overrides() -> tuple[str, ...]:
    """The ``--set`` items of the uniform variant of ``dpfl reproduce locks``.

    Every setting where preset locks-fmnist-uniform differs from locks-fmnist
    (:func:`dpfl.experiments.presets.preset_changes`): the first-stage
    probability that uploads as many clients a round as LOCKS expects to, the
    second stage and norms that make every stage-1 client upload, FedAvg's
    server step, and the smaller update noise that charges the expected
    client LOCKS's ε. The two preset files are the one source of these
    settings.
    """
    from dpfl.experiments.presets import preset_changes

    return preset_changes(LOCKS_PRESET, UNIFORM_PRESET)


def _locks_experiment(scale: str) -> Experiment:
    variants = (("LOCKS", ()), ("uniform", uniform_overrides()))
    like_for_like = (
        "The uniform variant is preset locks-fmnist-uniform's changes to "
        "locks-fmnist: K q1 uploads a round, as many as LOCKS's expected second "
        "stage, at the update noise that charges an expected client LOCKS's ε "
        "(LOCKS spends part of it on the noisy norms; both presets' headers). "
        "Both run under the presets' budget (ε = 20, δ = 1e-5): a run stops "
        "before any client would pass it. The ε column is the ledger's: the "
        "worst-off client of each run, against the server."
    )
    if scale == "smoke":
        return Experiment(
            "Figure 1: LOCKS against uniform client sampling at equal expected "
            "uploads and equal ε, on the bundled digits stand-in",
            "locks-digits",
            ("rounds=3", "eval_every=1"),
            variants,
            seeds=2,
            note="digits, 100 clients (iid), logistic regression; LOCKS as preset "
            "locks-digits (locks-fmnist's settings on digits). " + like_for_like,
            printed=_locks_printed(
                "8 x 8 digits instead of MNIST, 3 rounds; the paper's settings are "
                "lost, so its curve cannot be set up"
            ),
        )
    return Experiment(
        "Figure 1: LOCKS against uniform client sampling at equal expected uploads "
        "and equal ε (presets locks-fmnist and locks-fmnist-uniform), "
        "Fashion-MNIST, 100 clients, logistic regression",
        LOCKS_PRESET,
        (),
        variants,
        seeds=3,
        note="Fashion-MNIST stands in for MNIST; the paper's K, E and noise "
        "multipliers are lost from its text (the presets' are dpfl's choices). "
        "150 rounds at either scale. " + like_for_like,
        printed=_locks_printed(
            "Fashion-MNIST instead of MNIST; the paper's K, E and noise multipliers "
            "are lost, so its curve cannot be set up; here both variants upload "
            "the same expected number of clients a round at the same expected ε"
        ),
    )


#: The stale-norm preset: locks-fmnist's algorithm and privacy on a task
#: whose updates stay below C (its header), releasing each client's last norm.
STALE_PRESET = "locks-fmnist-stale"

#: The ``--set`` item of the current-norm variant: its only change to the
#: stale one.
CURRENT_NORM = ('algorithm.params.norm_source="current"',)


def stale_overrides() -> tuple[str, ...]:
    """The ``--set`` items that turn locks-fmnist into locks-fmnist-stale.

    Every setting where preset locks-fmnist-stale differs from locks-fmnist
    (:func:`dpfl.experiments.presets.preset_changes`): two label shards per
    client and the local step 0.05 that keep the updates below the clip norm
    C (at locks-fmnist's step 0.5 every update is clipped to norm C, so the
    stale and current norms are equal and the runs identical), and the stale
    norm. Applied to locks-digits they carry the stale task over to the
    bundled digits (smoke scale).
    """
    from dpfl.experiments.presets import preset_changes

    return preset_changes(LOCKS_PRESET, STALE_PRESET)


def _stale_experiment(scale: str) -> tuple[Experiment, ...]:
    variants = (("stale", ()), ("current", CURRENT_NORM))
    like_for_like = (
        "The two variants differ only in `algorithm.params.norm_source`: each "
        "stage-1 client releases the noisy norm of the clipped update it "
        "computed the last time it was in stage 1 (stale; its current update's "
        "the first time) or of this round's update (current). Either is one "
        "Gaussian release of a norm in [0, C] a stage-1 round, so the ledger "
        "charges both alike (budget ε = 20, δ = 1e-5, as the preset). The task "
        "keeps every update below C, so the released norms differ."
    )
    data = "8 x 8 digits, 10 rounds" if scale == "smoke" else "Fashion-MNIST"
    printed = tuple(
        (
            v,
            Printed(
                None,
                "none: the paper compares no norm sources (its clients release "
                "'a private estimate of their last gradient norm', §6)",
            ),
            f"{why}; {data}",
        )
        for v, why in (
            ("stale", "the paper's own variant, at dpfl's settings"),
            ("current", "dpfl's comparison, not in the paper"),
        )
    )
    if scale == "smoke":
        return (
            Experiment(
                "LOCKS with the stale norm against the current norm, on the "
                "bundled digits stand-in",
                "locks-digits",
                ("rounds=10", "eval_every=5", *stale_overrides()),
                variants,
                seeds=2,
                note="digits, 100 clients x 2 label shards, logistic regression, "
                "local step 0.05: preset locks-fmnist-stale's changes to "
                "locks-fmnist, carried over to locks-digits (the updates' norms "
                "are 0.4-0.75 before clipping, below C = 1). " + like_for_like,
                printed=printed,
            ),
        )
    return (
        Experiment(
            "LOCKS with the stale norm against the current norm (preset "
            "locks-fmnist-stale), Fashion-MNIST, 100 clients x 2 label shards, "
            "logistic regression",
            STALE_PRESET,
            (),
            variants,
            seeds=3,
            note="Fashion-MNIST stands in for MNIST; local step 0.05 keeps the "
            "updates' norms at 0.5-0.8 before clipping, below C = 1. 150 rounds "
            "at either scale. " + like_for_like,
            printed=printed,
        ),
    )


#: The ``--set`` items of every variant of the noise-free staleness experiment.
NOISE_FREE = ("privacy.noise_multiplier=0", "privacy.epsilon=.inf")


def _noise_free_uniform() -> tuple[str, ...]:
    """Uniform sampling of the noise-free staleness experiment.

    The uniform preset's changes (:func:`uniform_overrides`: every stage-1
    client uploading, FedAvg's server step) without its noise and with
    K q1 = 10 uploads a round, as LOCKS's second stage of m2 = 10 without
    norm noise.
    """
    kept = tuple(
        item
        for item in uniform_overrides()
        if not item.startswith(
            ("privacy.", "algorithm.params.first_stage_probability=")
        )
    )
    return ("algorithm.params.first_stage_probability=0.1", *kept)


def _staleness_alone(scale: str) -> tuple[Experiment, ...]:
    """The stale norm's own cost, with neither norm nor update noise."""
    if scale == "smoke":
        return ()
    no_paper = Printed(
        None, "none: the paper compares no norm sources, and runs nothing without noise"
    )
    return (
        Experiment(
            "The stale norm's own cost: stale against current norms and uniform "
            "sampling with no noise at all (preset locks-fmnist-stale, not "
            "private)",
            STALE_PRESET,
            NOISE_FREE,
            (
                ("stale (no noise)", ()),
                ("current (no noise)", CURRENT_NORM),
                ("uniform (no noise)", _noise_free_uniform()),
            ),
            seeds=12,
            note="An ablation, not a private run: σ_g = σ_n = 0, so each stage-1 "
            "client's norm is released exactly and only the norm's age differs "
            "between the first two variants. Under the budget the norm noise "
            "(σ_n C = 6) is twenty times the spread of the clients' norms, so the "
            "private comparison above cannot separate them; this one shows "
            "what there is to separate: little, since sampling in proportion "
            "to norms n cuts the sampling variance against uniform sampling by "
            "the factor E[n]²/E[n²], about 0.98 for norms spread over 0.5-0.8 "
            "(the preset's). The uniform variant uploads K q1 = 10 "
            "clients a round, as LOCKS's second stage of m2 = 10 does without "
            "noise, with FedAvg's server step. 12 seeds, because the "
            "differences are a few hundredths.",
            printed=tuple(
                (
                    f"{v} (no noise)",
                    no_paper,
                    "dpfl's ablation, not private; Fashion-MNIST",
                )
                for v in ("stale", "current", "uniform")
            ),
        ),
    )


def _locks_more(scale: str) -> tuple[Experiment, ...]:
    return _stale_experiment(scale) + _staleness_alone(scale)


PAPER = Paper(
    name="locks",
    summary="LOCKS: two-stage client sampling with a noisy norm and a noisy update",
    flags=_flags,
    account=account,
    calibrate=calibrate,
    analyses=_analyses,
    reproduction=Reproduction(
        "locks",
        "LOCKS: two-stage norm-proportional client sampling",
        _locks,
        _locks_figures,
        _locks_experiment,
        (
            "The paper's equations and noise multipliers are lost from its text; "
            "its Theorem 5.1 convergence bound is not reproduced.",
        ),
        more=_locks_more,
    ),
)
