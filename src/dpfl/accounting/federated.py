"""PriFedSync's weak and strong federated f-DP (Zheng, Chen, Long & Su 2021)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from dpfl._validate import (
    check_count,
    check_delta,
)
from dpfl.accounting.bounds import Bound, Guarantee
from dpfl.accounting.fdp import clt_mu
from dpfl.accounting.gaussian import (
    gdp_epsilon,
)
from dpfl.accounting.subsampled import (
    exact_epsilon,
    mu_effective,
)
from dpfl.errors import InvalidParameterError

__all__ = ["strong_federated", "weak_federated"]


def _broadcast(
    values: dict[str, Any], num_clients: int | None
) -> list[tuple[Any, ...]]:
    lengths = {len(v) for v in values.values() if isinstance(v, Sequence | np.ndarray)}
    if len(lengths) > 1:
        raise InvalidParameterError(
            f"per-client sequences must have equal lengths; got {sorted(lengths)}"
        )
    m = lengths.pop() if lengths else None
    if num_clients is not None:
        nc = check_count("num_clients", num_clients, minimum=2)
        if m is not None and m != nc:
            raise InvalidParameterError(
                f"num_clients must equal the length of per-client sequences "
                f"({m}); got {num_clients!r}"
            )
        m = nc
    if m is None:
        m = 1
    cols = [
        list(v) if isinstance(v, Sequence | np.ndarray) else [v] * m
        for v in values.values()
    ]
    if m < 1:
        raise InvalidParameterError("at least one client is needed")
    return list(zip(*cols))


def _federated(
    notion: str,
    noise_multiplier: float | Sequence[float],
    batch_size: int | Sequence[int],
    records_per_client: int | Sequence[int],
    local_steps: int | Sequence[int],
    rounds: int,
    delta: float,
    value_discretization: float,
    num_clients: int | None,
) -> Guarantee:
    d = check_delta("delta", delta)
    clients = _broadcast(
        {
            "noise_multiplier": noise_multiplier,
            "batch_size": batch_size,
            "records_per_client": records_per_client,
            "local_steps": local_steps,
        },
        num_clients,
    )
    m = len(clients)
    mus = [
        clt_mu(
            noise_multiplier=s,
            batch_size=b,
            records_per_client=n,
            local_steps=k,
            rounds=rounds,
        )
        for s, b, n, k in clients
    ]
    exact: dict[tuple[float, int, int, int], Bound] = {}
    for s, b, n, k in clients:
        key = (float(s), int(b), int(n), int(k))
        if key not in exact:
            exact[key] = exact_epsilon(
                d,
                noise_multiplier=s,
                batch_size=b,
                records_per_client=n,
                local_steps=k,
                rounds=rounds,
                value_discretization=value_discretization,
            )
    uppers = [exact[(float(s), int(b), int(n), int(k))].upper for s, b, n, k in clients]
    j = int(np.argmax(uppers))
    s_j, b_j, n_j, k_j = clients[j]
    bound = exact[(float(s_j), int(b_j), int(n_j), int(k_j))]
    mu_max = max(mus)
    values: dict[str, Any] = {
        "epsilon": bound,
        "delta": d,
        "mu_effective": mu_effective(epsilon=bound.upper, delta=d),
        "least_private_client": j,
        "mu_clt": mu_max,
        "epsilon_clt": gdp_epsilon(d, mu=mu_max),
        "num_clients": m,
    }
    notes = [
        "epsilon is exact: C_{B/n}(G_{1/sigma})^{(x)KR} of the least private "
        "client, composed with a PLD (upper: pessimistic, lower: optimistic).",
        "mu_clt is the CLT limit of Theorem 2 (G_{mu_max}): an approximation, "
        "not a bound.",
        "sigma is the paper's: noise std on the clipped sum is 2*C*sigma "
        "(replace-one); Opacus' noise_multiplier equals 2*sigma.",
        "no amplification by client sampling p is claimed (Lemma 3.8's p^2 "
        "term is not justified; docs/analyses.md).",
    ]
    if notion == "weak":
        adversary = (
            "any single other client i, who sees its own helper model "
            "(weak federated f-DP, one-vs-one)"
        )
    else:
        adversary = (
            "all other clients jointly, who see every helper model but j's "
            "(strong federated f-DP, one-vs-all)"
        )
        mu_paper = math.sqrt(m - 1) * mu_max
        values["mu_paper"] = mu_paper
        values["epsilon_paper"] = gdp_epsilon(d, mu=mu_paper)
        notes.append(
            "the same exact bound holds against all other clients jointly: every "
            "helper is post-processing of the transcript in which only client j's "
            "K*R noisy steps touch its data (docs/analyses.md)."
        )
        notes.append(
            "mu_paper = sqrt(m-1)*mu_max is the paper's Theorem 2 strong bound "
            "G_{sqrt(m-1) mu_max}: valid but loose; reported beside, not instead."
        )
    return Guarantee(
        unit="record",
        neighbouring="replace-one",
        adversary=adversary,
        analysis="sound (exact PLD composition); CLT mu reported beside",
        values=values,
        notes=tuple(notes),
    )


def weak_federated(
    *,
    noise_multiplier: float | Sequence[float],
    batch_size: int | Sequence[int],
    records_per_client: int | Sequence[int],
    local_steps: int | Sequence[int],
    rounds: int,
    delta: float = 1e-5,
    value_discretization: float = 1e-3,
    num_clients: int | None = None,
) -> Guarantee:
    """Return PriFedSync's weak federated f-DP guarantee (least private client).

    Weak federated f-DP (Definition 3.5): for every pair ``i != j``,
    ``T(M_i(S), M_i(S'^j)) >= f``. By Theorem 2 (post-processing of client
    ``j``'s NoisySGD) ``f = C_{B_j/n_j}(G_{1/σ_j})^{⊗KR}`` for client ``j``,
    so the federation's guarantee is that of the least private client; dpfl
    reports it exactly (ε at ``delta``) and the CLT ``G_{μ_max}`` beside it.

    Parameters
    ----------
    noise_multiplier : float or sequence of float
        Paper's σ per client (scalar: the same for all).
    batch_size : int or sequence of int
        ``B_j`` per client.
    records_per_client : int or sequence of int
        ``n_j`` per client.
    local_steps : int or sequence of int
        ``K`` (per client if a sequence).
    rounds : int
        ``R`` synchronisation rounds.
    delta : float, default 1e-5
        The δ at which ε is reported (the paper's tables imply 1e-5).
    value_discretization : float, default 1e-3
        PLD grid step.
    num_clients : int, optional
        ``m`` (needed only when every parameter is a scalar).

    Returns
    -------
    Guarantee
        ``values``: ``epsilon`` (:class:`Bound`), ``delta``, ``mu_effective``,
        ``least_private_client``, ``mu_clt`` (= μ_max), ``epsilon_clt``,
        ``num_clients``.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain or sequences differ in length.

    References
    ----------
    .. [1] Zheng et al. 2021, Definition 3.5, Theorem 2.
    """
    return _federated(
        "weak",
        noise_multiplier,
        batch_size,
        records_per_client,
        local_steps,
        rounds,
        delta,
        value_discretization,
        num_clients,
    )


def strong_federated(
    *,
    noise_multiplier: float | Sequence[float],
    batch_size: int | Sequence[int],
    records_per_client: int | Sequence[int],
    local_steps: int | Sequence[int],
    rounds: int,
    delta: float = 1e-5,
    value_discretization: float = 1e-3,
    num_clients: int | None = None,
) -> Guarantee:
    """Return PriFedSync's strong federated f-DP guarantee (sound and paper's).

    Strong federated f-DP (Definition 3.6): ``T(M_{−j}(S), M_{−j}(S'^j)) >= f``
    against all other clients' helper models jointly. The sound bound is the
    same as the weak one, ``C_{B/n}(G_{1/σ})^{⊗KR}`` (≈ ``G_{μ_max}``),
    because all helpers are post-processing of one transcript in which only
    client ``j``'s ``KR`` noisy steps touch its records (docs/analyses.md). The
    paper's ``G_{sqrt(m−1) μ_max}`` (valid, loose) is reported beside it.

    Parameters
    ----------
    noise_multiplier : float or sequence of float
        Paper's σ per client (scalar: the same for all).
    batch_size : int or sequence of int
        ``B_j`` per client.
    records_per_client : int or sequence of int
        ``n_j`` per client.
    local_steps : int or sequence of int
        ``K`` (per client if a sequence).
    rounds : int
        ``R`` synchronisation rounds.
    delta : float, default 1e-5
        The δ at which ε is reported.
    value_discretization : float, default 1e-3
        PLD grid step.
    num_clients : int, optional
        ``m`` (required when every parameter is a scalar; >= 2).

    Returns
    -------
    Guarantee
        As :func:`weak_federated`, plus ``mu_paper`` (= sqrt(m−1) μ_max) and
        ``epsilon_paper``.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain, or ``m`` is unknown or < 2.

    References
    ----------
    .. [1] Zheng et al. 2021, Definition 3.6, Theorem 2.
    """
    if num_clients is None and not any(
        isinstance(v, Sequence | np.ndarray)
        for v in (noise_multiplier, batch_size, records_per_client, local_steps)
    ):
        raise InvalidParameterError(
            "num_clients is required when every per-client parameter is a scalar"
        )
    g = _federated(
        "strong",
        noise_multiplier,
        batch_size,
        records_per_client,
        local_steps,
        rounds,
        delta,
        value_discretization,
        num_clients,
    )
    if g.values["num_clients"] < 2:
        raise InvalidParameterError(
            f"strong federated f-DP needs >= 2 clients; got {g.values['num_clients']}"
        )
    return g
