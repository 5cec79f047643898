"""Each paper's figures for a recorded run, read from its ledger.

The formula modules (:mod:`~dpfl.accounting.checkin`,
:mod:`~dpfl.accounting.fdp`, :mod:`~dpfl.accounting.rdp`) price events and
evaluate a paper's closed forms from numbers; they never read a ledger. The
reports here sit above the :class:`~dpfl.accounting.ledger.PrivacyLedger`:
they read what a run recorded (who took part, how often) and put the sound
figure beside the paper's own, each labelled.

* :func:`ms_pafl_report` -- MS-PAFL (Li et al., arXiv 2509.25906): the sound
  per-client figure beside Theorems 2-4;
* :func:`prifedsync_report` -- PriFedSync (Zheng et al. 2021): weak and strong
  federated f-DP and the paper's CLT mu beside the ledger's epsilon;
* :func:`locks_report` -- LOCKS: the worst client's guarantee against the
  server and against observers of the models.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dpfl._validate import check_count, check_delta, check_positive
from dpfl.accounting import (
    checkin,
    checkin_global,
    fdp,
    federated,
    rdp,
    schemes,
    subsampled,
)
from dpfl.accounting import events as ev
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.errors import DpflError, InvalidParameterError

__all__ = ["locks_report", "ms_pafl_report", "prifedsync_report"]


def ms_pafl_report(
    ledger: PrivacyLedger,
    *,
    noise_multiplier: float,
    clip: float,
    probabilities: Sequence[float] | np.ndarray,
    local_epsilon: float,
    local_delta: float,
    gamma: float,
    xi: float,
    delta: float,
) -> dict[str, Any]:
    """An MS-PAFL run's guarantee: the sound figure and the paper's, labelled.

    Parameters
    ----------
    ledger : PrivacyLedger
        The run's ledger (rounds recorded with their participants).
    noise_multiplier : float
        Each message's noise std in units of ``clip`` (> 0).
    clip : float
        Clip norm C (> 0) of the public update.
    probabilities : sequence of float
        The clients' check-in probabilities p_k.
    local_epsilon, local_delta : float
        The per-round local (ε, δ) of one message (Lemma 1 / Theorem 1).
    gamma : float
        γ: the probability that a record is touched in a round's local steps
        (:func:`~dpfl.accounting.checkin.subsampling_ratio`, the largest over
        the clients).
    xi : float
        Hoeffding parameter ξ in (0, 1) of Theorem 2.
    delta : float
        Target δ of the totals.

    Returns
    -------
    dict
        ``"rounds"``, ``"delta"``; ``"sound"``: max over clients of the
        ledger's per-client ε (un-amplified Gaussian composed over the rounds
        each client joined; ``rounds_joined_max``, an exact-GDP cross-check
        ``epsilon_gdp``, and the terms). With at least one round also
        ``"paper_ledger"`` (the ledger's ε under the paper's analysis: CheckIn
        amplified as Poisson(p) over all rounds), ``"paper_central_round"``
        (Theorem 2's (ε_c, δ_c) of one round of the global public model, eq. 19
        with the clients' own p_k, for the most exposed client),
        ``"paper_global_total"`` (Theorem 4) and ``"paper_local_total"``
        (Theorem 3). Each paper figure carries a ``caveat``; a figure whose
        formula does not apply holds ``{"error": reason}``.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    Li, Wang, Tian, Wang & Su, "MS-PAFL", arXiv 2509.25906, Theorems 2-4;
    docs/analyses.md.
    """
    z = check_positive("noise_multiplier", noise_multiplier)
    c = check_positive("clip", clip)
    delta = check_delta("delta", delta)
    # pylint: disable-next=protected-access
    probs = checkin_global._probabilities("probabilities", probabilities)
    rounds = ledger.rounds
    counts: dict[int, int] = {}
    for entry in ledger.entries:
        for k in entry.participants or ():
            counts[k] = counts.get(k, 0) + 1
    out: dict[str, Any] = {"rounds": rounds, "delta": delta}
    if counts:
        worst = max(counts, key=lambda k: (counts[k], -k))
        # the sound figure whatever analysis the run itself was charged under
        bound = ledger.client_epsilon(worst, delta, analysis="sound")
        n_max = counts[worst]
    else:
        worst, n_max, bound = -1, 0, None
    gdp = checkin.sound_client(
        noise_multiplier=z, clip=c, rounds_joined=n_max, delta=delta
    )
    out["sound"] = {
        "epsilon": 0.0 if bound is None else bound.upper,
        "bound": bound,
        "epsilon_gdp": gdp["epsilon"],
        "client": worst,
        "rounds_joined_max": n_max,
        "unit": "record (and client: Δ = 2C bounds any change of D_k)",
        "neighbouring": "replace-one",
        "adversary": "the parameter server (sees each message and who checked in)",
        "analysis": "sound: un-amplified Gaussian, composed over the rounds "
        "the client joined (docs/analyses.md)",
    }
    if rounds == 0:
        return out
    try:
        paper = ledger.epsilon(delta, analysis="paper").upper
    except DpflError as exc:
        out["paper_ledger"] = {"error": str(exc)}
    else:
        out["paper_ledger"] = {
            "epsilon": paper,
            "analysis": "paper: every round's release amplified by check-in as "
            "Poisson(max p_k), composed over all rounds (PLD)",
            "caveat": "not valid against the server, which sees who checked in "
            "(docs/analyses.md)",
        }
    try:
        # Theorem 2 in its heterogeneous form (eq. 19): Σ_j p_j check-ins
        # expected; the figure is the most exposed client's (largest p_k).
        eps_cs, delta_cs = checkin_global.central_round_clients(
            epsilon=local_epsilon,
            delta=local_delta,
            probabilities=probs,
            gammas=gamma,
            xi=xi,
        )
        eps_c, delta_c = float(eps_cs.max()), float(delta_cs.max())
        out["paper_central_round"] = {
            "epsilon": eps_c,
            "delta": delta_c,
            "local_epsilon": local_epsilon,
            "local_delta": local_delta,
            "gamma": gamma,
            "xi": xi,
            "analysis": "paper: Theorem 2 / Corollary 1, eq. 19 with the "
            "clients' own p_k (exact Poisson-binomial tail), for the client "
            "with the largest p_k",
            "caveat": "protects against parties that see the global public "
            "model only, assumes σ from Lemma 1 and γ amplification, which "
            "the persistent private part invalidates (docs/analyses.md)",
        }
        eps_g, delta_g = checkin_global.global_total(
            eps_max=eps_c, delta_max=delta_c, rounds=rounds, delta_slack=delta
        )
        out["paper_global_total"] = {
            "epsilon": eps_g,
            "delta": delta_g,
            "analysis": "paper: Theorem 4 (strong composition, DRV)",
            "caveat": "composes the per-round Theorem-2 figure; same caveat",
        }
    except InvalidParameterError as exc:
        out["paper_central_round"] = {"error": str(exc)}
        out["paper_global_total"] = {"error": str(exc)}
    if gamma < 1:
        local = checkin.local_total_moments(
            probability=float(probs.max()),
            rounds=rounds,
            gamma=gamma,
            noise_multiplier=z,
            clip=c,
            delta=delta,
        )
        local["caveat"] = (
            "uses the expected p·R rounds and γ amplification (docs/analyses.md)"
        )
        out["paper_local_total"] = local
    else:
        out["paper_local_total"] = {"error": "γ = 1: no data subsampling"}
    return out


def prifedsync_report(
    ledger: PrivacyLedger,
    *,
    delta: float,
    noise_multiplier: float,
    batch_size: int,
    records_per_client: int,
    local_steps: int,
    num_clients: int,
) -> dict[str, Any]:
    """Weak and strong federated f-DP of a PriFedSync run recorded in ``ledger``.

    Every round charges each synced client the same event, and ε grows with
    the number of compositions, so the least private client is the one that
    synced most often (``R_max`` rounds); ``ledger.client_epsilon`` of that
    client is the run's sound ε. It is reported beside the exact
    :func:`~dpfl.accounting.federated.weak_federated` and
    :func:`~dpfl.accounting.federated.strong_federated` guarantees for
    ``K · R_max`` steps and the paper's CLT μ (an approximation, not a
    bound), at ``R_max`` and at the total number of rounds ``R`` (the
    paper's tables charge every client all ``R`` rounds).

    Parameters
    ----------
    ledger : PrivacyLedger
        The run's ledger (rounds recorded with their synced clients).
    delta : float
        δ in (0, 1).
    noise_multiplier : float
        The paper's σ (> 0): noise std ``2Cσ`` on a step's clipped sum.
    batch_size : int
        B records per local step.
    records_per_client : int
        n, the smallest client's number of records.
    local_steps : int
        K local steps per synced round.
    num_clients : int
        Clients in the federation.

    Returns
    -------
    dict
        ``epsilon`` / ``epsilon_lower`` (ledger, sound), ``delta``,
        ``rounds``, ``max_client_rounds``, ``least_private_client``,
        ``mu_effective``, ``mu_clt`` (at ``R_max``), ``mu_clt_all_rounds``
        (at ``R``), ``epsilon_clt``, ``strong_mu_paper``, and the
        :class:`~dpfl.accounting.bounds.Guarantee` objects ``weak`` and
        ``strong`` (``None`` for a single client).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If a parameter is outside its domain or the ledger holds no round.
    """
    d = check_delta("delta", delta)
    num_clients = check_count("num_clients", num_clients, minimum=1)
    if ledger.rounds == 0:
        raise InvalidParameterError("the ledger holds no round")
    counts = np.zeros(num_clients, dtype=np.int64)
    for entry in ledger.entries:
        if entry.participants is None:
            counts += 1
        else:
            counts[list(entry.participants)] += 1
    least = int(np.argmax(counts))
    r_max = int(counts[least])
    eps = ledger.client_epsilon(least, d)
    common: dict[str, Any] = {
        "noise_multiplier": float(noise_multiplier),
        "batch_size": int(batch_size),
        "records_per_client": int(records_per_client),
        "local_steps": int(local_steps),
    }
    weak = federated.weak_federated(
        rounds=r_max,
        delta=d,
        num_clients=num_clients if num_clients >= 2 else None,
        **common,
    )
    strong = (
        federated.strong_federated(
            rounds=r_max, delta=d, num_clients=num_clients, **common
        )
        if num_clients >= 2
        else None
    )
    return {
        "epsilon": eps.upper,
        "epsilon_lower": eps.lower,
        "delta": d,
        "rounds": ledger.rounds,
        "max_client_rounds": r_max,
        "least_private_client": least,
        "mu_effective": subsampled.mu_effective(epsilon=eps.upper, delta=d),
        "mu_clt": weak.values["mu_clt"],
        "mu_clt_all_rounds": fdp.clt_mu(rounds=ledger.rounds, **common),
        "epsilon_clt": weak.values["epsilon_clt"],
        "strong_mu_paper": None if strong is None else strong.values["mu_paper"],
        "weak": weak,
        "strong": strong,
    }


def locks_report(
    ledger: PrivacyLedger,
    *,
    noise_multiplier: float,
    norm_noise_ratio: float,
    event: ev.Event,
    delta: float | None = None,
) -> dict[str, Any]:
    """LOCKS: the worst client's guarantee of a run, for the server and observers.

    The norm noise is ``σ_n = norm_noise_ratio · σ_g`` (σ_g =
    ``noise_multiplier``): the two scales move together when σ is calibrated.

    Parameters
    ----------
    ledger : dpfl.accounting.ledger.PrivacyLedger
        The run's ledger: participants = S1 and ``extra["second_stage"]`` = S2
        in every entry.
    noise_multiplier : float
        σ_g > 0, noise std of each uploaded update in units of the clip.
    norm_noise_ratio : float
        σ_n / σ_g > 0.
    event : Event
        The run's round event (``TwoStage``), for the observer view's terms.
    delta : float, optional
        Target δ (default: the ledger budget's δ).

    Returns
    -------
    dict
        ``"rounds"``, ``"delta"``; ``"server_view"``: the most exposed
        client's realised N1 (noisy norms sent) and N2 (noisy updates sent)
        composed by :func:`~dpfl.accounting.rdp.locks_server_view` (zero-out; also
        ``epsilon_replace_one``), with ``epsilon_ledger`` (the ledger's
        figure for that client) and ``client``; ``"observer_view"``: the
        ledger's ε for parties that see only the released models, which dpfl
        bounds by the server's view (no amplification is claimed: the noise is
        added by the clients, so the aggregate's noise level reveals who took
        part), with the guarantee's terms.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If no δ is given and the ledger has no budget, or a parameter is out
        of its domain.

    References
    ----------
    "LOCKS: User differentially private and federated optimal client
    sampling", Theorem 5.3; Dong, Roth & Su (2022), Corollary 3.3;
    docs/analyses.md.
    """
    sg = check_positive("noise_multiplier", noise_multiplier)
    sn = sg * check_positive("norm_noise_ratio", norm_noise_ratio)
    if delta is None:
        if ledger.budget is None:
            raise InvalidParameterError(
                "delta must be given when the ledger has no budget"
            )
        delta = ledger.budget.delta
    dlt = check_delta("delta", delta)
    worst, bound = ledger.worst_unit(dlt, analysis="server")
    n1 = n2 = 0
    for entry in ledger.entries:
        if worst is not None and worst in (entry.participants or ()):
            n1 += 1
            n2 += worst in entry.extra.get("second_stage", ())
    kw: dict[str, Any] = {
        "norm_noise_multiplier": sn,
        "update_noise_multiplier": sg,
        "norm_rounds": n1,
        "update_rounds": n2,
        "delta": dlt,
    }
    server = rdp.locks_server_view(**kw)
    server["epsilon_replace_one"] = rdp.locks_server_view(
        **kw, neighbouring="replace-one"
    )["epsilon"]
    server["epsilon_ledger"] = bound.upper
    server["client"] = worst
    observer = {
        "epsilon": ledger.epsilon(dlt, analysis="observer").upper,
        **schemes.describe(event, "observer"),
    }
    return {
        "rounds": ledger.rounds,
        "delta": dlt,
        "server_view": server,
        "observer_view": observer,
    }
