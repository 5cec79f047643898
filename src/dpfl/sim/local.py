"""Local optimisation of a cohort: one step for every client at once.

Each client's parameters are one *row* of stacked tensors ``[num_clients,
...]`` (:func:`dpfl.sim.grad.stack_params`), so a local step of the whole
cohort is a few batched operations instead of a loop over clients.

:func:`cohort_sgd_step`
    Mini-batch SGD: per-client gradient sums of the cohort in one batched
    pass (:func:`dpfl.sim.grad.batched_client_grads`), then ``θ_k − lr ·
    mean gradient``.
:func:`cohort_adam_step`
    Adam on stacked rows, each row with its own step count, with public
    tensor operations only. It is ``torch.optim.Adam``'s update
    (``amsgrad=False``, no weight decay, not maximising) applied to each row,
    operation for operation: the bias corrections are computed per row in
    Python floats as torch does, ``ε`` is added to ``√v̂`` after the bias
    correction (``√v / √(1 − β₂ᵗ) + ε``), and the first moment is updated with
    ``lerp``; float32 results equal ``torch.optim.Adam``'s run row by row
    (tested at ``atol=1e-6``, bit-identical in practice on CPU).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from dpfl._validate import check_count, check_positive, check_probability
from dpfl.errors import InvalidParameterError
from dpfl.sim.grad import LossFn, batched_client_grads, check_finite
from dpfl.sim.grad.cohort import cohort_sgd_inplace, fused_sgd_supported
from dpfl.sim.objectives import Erm, LocalObjective

__all__ = [
    "client_local_sgd",
    "cohort_adam_step",
    "cohort_local_sgd",
    "cohort_sgd_step",
    "epoch_orders",
    "pad_cohort",
    "pad_orders",
]

Params = dict[str, torch.Tensor]
#: Entries per block of rows in :func:`cohort_adam_step`: its nine elementwise
#: passes run block by block while the block is in cache (≈ 1.6× faster than
#: whole-tensor passes for [50, 159k] on 2 cores; same numbers).
_ADAM_BLOCK = 2**19


def cohort_sgd_step(
    model: nn.Module,
    stacked_params: Mapping[str, torch.Tensor],
    xb: torch.Tensor,
    yb: torch.Tensor,
    *,
    learning_rate: float,
    loss_fn: LossFn = F.cross_entropy,
    sample_mask: torch.Tensor | None = None,
    max_clients: int | None = None,
) -> Params:
    """One SGD step for every client of a cohort at once.

    Client ``k`` with ``b_k`` examples (``b_k = Σ_i m_ki``) moves to
    ``θ_k − learning_rate · (Σ_i g_ki) / b_k``.

    Parameters
    ----------
    model : torch.nn.Module
        The model (structure only).
    stacked_params : mapping of str to torch.Tensor
        ``[num_clients, *shape]`` per parameter.
    xb : torch.Tensor
        Inputs ``[num_clients, batch, ...]``.
    yb : torch.Tensor
        Targets ``[num_clients, batch, ...]``.
    learning_rate : float
        Step size > 0.
    loss_fn : callable
        ``loss_fn(output, target)``, the mean of per-example losses.
    sample_mask : torch.Tensor, optional
        ``[num_clients, batch]`` 0/1 weights for padded batches.
    max_clients : int, optional
        Clients per chunk, to bound memory.

    Returns
    -------
    dict of str to torch.Tensor
        The new stacked parameters (the input is not modified).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On a bad learning rate or shapes.
    dpfl.errors.NonFiniteUpdateError
        If a client's gradient is not finite.
    """
    learning_rate = check_positive("learning_rate", learning_rate)
    sums = batched_client_grads(
        model,
        stacked_params,
        xb,
        yb,
        loss_fn=loss_fn,
        sample_mask=sample_mask,
        max_clients=max_clients,
    )
    if sample_mask is None:
        counts = torch.full((xb.shape[0],), float(xb.shape[1]), device=xb.device)
    else:
        counts = sample_mask.to(torch.float32).sum(1).clamp_min(1.0)
    # θ_k − lr · s_k / b_k as one fused multiply-add per tensor.
    factor = -learning_rate / counts
    new: Params = {}
    for k, s in sums.items():
        shape = (-1,) + (1,) * (s.dim() - 1)
        f = factor.to(device=s.device, dtype=s.dtype).reshape(shape)
        new[k] = torch.addcmul(stacked_params[k].detach(), s, f)
    return new


def _per_row(values: list[float], like: torch.Tensor) -> torch.Tensor:
    """Python floats, one per row, as ``[rows, 1, ..., 1]`` in ``like``'s dtype."""
    t = torch.tensor(values, dtype=torch.float64, device=like.device)
    return t.to(like.dtype).view(-1, *(1,) * (like.dim() - 1))


def cohort_adam_step(
    params: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    steps: torch.Tensor,
    *,
    learning_rate: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> torch.Tensor:
    """One Adam step for every row (client) of stacked parameters.

    For row ``k`` with step count ``t = steps[k] + 1``, as ``torch.optim.Adam``
    (``amsgrad=False``, ``weight_decay=0``, ``maximize=False``)::

        m ← β₁ m + (1 − β₁) g                  (lerp)
        v ← β₂ v + (1 − β₂) g²
        θ ← θ − lr / (1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)

    Add an L2 penalty (torch's ``weight_decay``) to ``grad`` before the call.

    Parameters
    ----------
    params : torch.Tensor
        ``[rows, ...]`` current parameters (not modified).
    grad : torch.Tensor
        Gradients, the shape of ``params``.
    exp_avg, exp_avg_sq : torch.Tensor
        First and second moments, the shape of ``params``; updated in place
        (zeros before a row's first step).
    steps : torch.Tensor
        ``[rows]`` integer step counts so far; incremented in place.
    learning_rate : float
        Step size > 0.
    betas : tuple of float
        ``(β₁, β₂)``, each in [0, 1).
    eps : float
        ``ε`` > 0, added to the bias-corrected ``√v``.

    Returns
    -------
    torch.Tensor
        The new parameters ``[rows, ...]``.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On a bad hyperparameter or mismatched shapes.
    """
    learning_rate = check_positive("learning_rate", learning_rate)
    eps = check_positive("eps", eps)
    if len(betas) != 2:
        raise InvalidParameterError(f"betas must be two numbers; got {betas!r}")
    beta1, beta2 = (
        check_probability(f"betas[{i}]", b, allow_zero=True, allow_one=False)
        for i, b in enumerate(betas)
    )
    shapes = {tuple(t.shape) for t in (params, grad, exp_avg, exp_avg_sq)}
    if len(shapes) != 1 or params.dim() < 1 or tuple(steps.shape) != params.shape[:1]:
        raise InvalidParameterError(
            "params, grad, exp_avg and exp_avg_sq must share one shape [rows, ...] "
            f"and steps be [rows]; got {sorted(shapes)} and {tuple(steps.shape)}"
        )
    steps += 1
    counts = [float(t) for t in steps.tolist()]
    # torch.optim.Adam's scalars, per row, in Python floats (double precision).
    neg_step_size = _per_row([-learning_rate / (1 - beta1**t) for t in counts], params)
    bias2_sqrt = _per_row([(1 - beta2**t) ** 0.5 for t in counts], params)
    new = torch.empty_like(params, memory_format=torch.contiguous_format)
    rows = max(1, _ADAM_BLOCK // max(1, params[0].numel()))
    for start in range(0, params.shape[0], rows):  # a block of rows stays in cache
        r = slice(start, start + rows)
        m, v, g = exp_avg[r], exp_avg_sq[r], grad[r]
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = v.sqrt().div_(bias2_sqrt[r]).add_(eps)
        # θ + (−step_size · m) / denom, rounded as addcdiv_ rounds it.
        torch.mul(m, neg_step_size[r], out=new[r]).div_(denom).add_(params[r].detach())
    return new


# -- local epochs of mini-batch SGD ---------------------------------------------------
def epoch_orders(rng: np.random.Generator, num_records: int, epochs: int) -> np.ndarray:
    """A client's visiting order of its records in each of ``epochs`` epochs.

    Parameters
    ----------
    rng : numpy.random.Generator
        The client's own generator (one permutation drawn per epoch, in order).
    num_records : int
        n >= 0, the client's records.
    epochs : int
        E >= 1.

    Returns
    -------
    numpy.ndarray
        ``[E, n]`` int64; row ``e`` is a permutation of ``0 .. n-1``.
    """
    n = check_count("num_records", num_records, minimum=0)
    e = check_count("epochs", epochs, minimum=1)
    if e == 1:  # the same draw, without the stack
        return rng.permutation(n).astype(np.int64, copy=False)[None]
    return np.stack([rng.permutation(n) for _ in range(e)]).astype(np.int64)


def pad_orders(orders: Sequence[np.ndarray]) -> np.ndarray:
    """A cohort's epoch orders as one ``[E, m, n_max]`` array, padded with ``-1``.

    Parameters
    ----------
    orders : sequence of numpy.ndarray
        Client ``j``'s ``[E, n_j]`` orders (:func:`epoch_orders`), one E for all.

    Returns
    -------
    numpy.ndarray
        ``[E, m, n_max]`` int64 (``n_max`` the largest ``n_j``).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If the cohort is empty or the clients have different numbers of epochs.
    """
    if not orders:
        raise InvalidParameterError("orders must hold at least one client")
    epochs = {o.shape[0] for o in orders}
    if len(epochs) != 1:
        raise InvalidParameterError(
            f"every client must have the same number of epochs; got {sorted(epochs)}"
        )
    n_max = max(o.shape[1] for o in orders)
    out = np.full((epochs.pop(), len(orders), n_max), -1, dtype=np.int64)
    for j, o in enumerate(orders):
        out[:, j, : o.shape[1]] = o
    return out


def pad_cohort(
    x: torch.Tensor, y: torch.Tensor, counts: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clients' records, concatenated, as ``[m, n_max, ...]`` padded with zeros.

    Parameters
    ----------
    x, y : torch.Tensor
        Features and targets of the cohort's records, client after client
        (``sum(counts)`` rows).
    counts : sequence of int
        Records of each client, in order.

    Returns
    -------
    tuple of torch.Tensor
        ``x_pad`` ``[m, n_max, ...]`` and ``y_pad`` ``[m, n_max, ...]``; client
        ``j``'s records are rows ``[j, :counts[j]]``, the rest zeros.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If the counts do not add up to the rows of ``x`` and ``y``.
    """
    sizes = _counts(counts)
    if not sizes or sum(sizes) != x.shape[0] or x.shape[0] != y.shape[0]:
        raise InvalidParameterError(
            f"counts must be non-empty and add up to the {x.shape[0]} rows of x "
            f"(and of y, {y.shape[0]}); got {sizes[:10]}"
        )
    m, n_max = len(sizes), max(sizes)
    if n_max * m == x.shape[0]:  # every client has n_max records: no padding
        return x.reshape(m, n_max, *x.shape[1:]), y.reshape(m, n_max, *y.shape[1:])
    slots = torch.as_tensor(
        np.concatenate(
            [j * n_max + np.arange(n, dtype=np.int64) for j, n in enumerate(sizes)]
        ),
        device=x.device,
    )
    x_pad = x.new_zeros((m * n_max, *x.shape[1:]))
    y_pad = y.new_zeros((m * n_max, *y.shape[1:]))
    x_pad[slots] = x
    y_pad[slots] = y
    return x_pad.reshape(m, n_max, *x.shape[1:]), y_pad.reshape(m, n_max, *y.shape[1:])


def _counts(counts: Sequence[int]) -> list[int]:
    """``counts`` as Python ints, checked to be integers >= 0 (one numpy pass)."""
    arr = np.asarray(counts)
    odd = arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu")
    if odd or any(isinstance(c, bool) for c in counts):
        return [check_count("counts", c, minimum=0) for c in counts]  # names it
    if arr.size and int(arr.min()) < 0:
        raise InvalidParameterError(
            f"counts must be >= 0; got minimum {int(arr.min())}"
        )
    return arr.tolist()


def _batches(orders: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Mini-batches of one epoch: ``[..., B]`` slices of the visiting orders."""
    n = orders.shape[-1]
    return [orders[..., s : s + batch_size] for s in range(0, n, batch_size)]


def client_local_sgd(
    model: nn.Module,
    params: Mapping[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    rng: np.random.Generator | None = None,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    loss_fn: LossFn = F.cross_entropy,
    objective: LocalObjective | None = None,
    orders: np.ndarray | None = None,
) -> Params:
    """One client's E epochs of mini-batch SGD from ``params`` (the reference).

    Each epoch visits the client's records in the order of
    :func:`epoch_orders` (drawn from ``rng``) in mini-batches of
    ``batch_size`` (the last one smaller); each step is
    ``θ ← θ − lr · mean gradient``, one ordinary backward.

    Parameters
    ----------
    model : torch.nn.Module
        The model (structure and buffers; its parameters are not changed).
    params : mapping of str to torch.Tensor
        Starting parameters (not modified).
    x, y : torch.Tensor
        The client's features ``[n, ...]`` and targets ``[n, ...]``.
    rng : numpy.random.Generator, optional
        The client's own generator (draws the epoch orders); or ``orders``.
    epochs : int
        E >= 1.
    batch_size : int
        B >= 1.
    learning_rate : float
        Step size > 0.
    loss_fn : callable
        ``loss_fn(output, target)``, mean over the batch.
    objective : LocalObjective, optional
        A regulariser whose gradient (at the current parameters, anchored at
        ``params``) is added to each step's data gradient
        (:mod:`dpfl.sim.objectives`); default none.
    orders : numpy.ndarray, optional
        ``[E, n]`` visiting orders drawn already (e.g.
        :meth:`dpfl.sim.randomness.Streams.epoch_orders`), instead of ``rng``.

    Returns
    -------
    dict of str to torch.Tensor
        The parameters after E epochs (detached).

    Raises
    ------
    dpfl.errors.NonFiniteUpdateError
        If a gradient is not finite.
    """
    batch_size = check_count("batch_size", batch_size, minimum=1)
    learning_rate = check_positive("learning_rate", learning_rate)
    orders = _orders_of(rng, orders, x.shape[0], epochs)
    w = {k: v.detach().clone() for k, v in params.items()}
    buffers = dict(model.named_buffers())
    for epoch in orders:
        for batch in _batches(epoch, batch_size):
            if batch.size == 0:
                continue
            idx = torch.as_tensor(batch, device=x.device)
            leaves = {k: v.requires_grad_(True) for k, v in w.items()}
            with torch.enable_grad():
                out = functional_call(model, (leaves, buffers), (x[idx],))
                grads = torch.autograd.grad(loss_fn(out, y[idx]), list(leaves.values()))
            check_finite(grads, "client gradient")
            w = {
                k: (v - learning_rate * g).detach()
                - _regulariser_step(objective, v.detach(), params[k], learning_rate)
                for (k, v), g in zip(leaves.items(), grads)
            }
    return w


def _orders_of(
    rng: np.random.Generator | None,
    orders: np.ndarray | None,
    num_records: int,
    epochs: int,
) -> np.ndarray:
    """A client's ``[E, n]`` orders: given, or drawn from ``rng`` (exactly one)."""
    if (rng is None) == (orders is None):
        raise InvalidParameterError("give exactly one of rng and orders")
    if orders is None:
        assert rng is not None
        return epoch_orders(rng, num_records, epochs)
    out = np.asarray(orders, dtype=np.int64)
    if out.shape != (epochs, num_records):
        raise InvalidParameterError(
            f"orders must have shape ({epochs}, {num_records}) (epochs, records); "
            f"got {out.shape}"
        )
    return out


def _regulariser_step(
    objective: LocalObjective | None,
    theta: torch.Tensor,
    anchor: torch.Tensor,
    learning_rate: float,
) -> torch.Tensor | float:
    """``lr · ∇R(θ; anchor)`` of a local objective (0 without one)."""
    if objective is None:
        return 0.0
    grad = objective.gradient(theta, anchor)
    return 0.0 if grad is None else learning_rate * grad


def cohort_local_sgd(
    model: nn.Module,
    stacked_params: Mapping[str, torch.Tensor],
    x_pad: torch.Tensor,
    y_pad: torch.Tensor,
    counts: Sequence[int],
    *,
    rngs: Sequence[np.random.Generator] | None = None,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    loss_fn: LossFn = F.cross_entropy,
    max_clients: int | None = None,
    objective: LocalObjective | None = None,
    orders: Sequence[np.ndarray] | None = None,
) -> Params:
    """A cohort's E epochs of mini-batch SGD, every step one batched call.

    Client ``j`` follows exactly the schedule of :func:`client_local_sgd`
    with ``rngs[j]``: its orders are drawn from its own generator, so the
    result is that of running :func:`client_local_sgd` client by client, up
    to float rounding (a batched kernel sums in another order).

    Parameters
    ----------
    model : torch.nn.Module
        The model (structure only).
    stacked_params : mapping of str to torch.Tensor
        ``[m, *shape]`` per parameter (:func:`dpfl.sim.grad.stack_params`);
        not modified.
    x_pad, y_pad : torch.Tensor
        ``[m, n_max, ...]`` padded records (:func:`pad_cohort`).
    counts : sequence of int
        Real records of each client (the rest of its row is padding).
    rngs : sequence of numpy.random.Generator, optional
        Each client's own generator, in cohort order; or ``orders``.
    epochs : int
        E >= 1.
    batch_size : int
        B >= 1.
    learning_rate : float
        Step size > 0.
    loss_fn : callable
        ``loss_fn(output, target)``, mean over the batch.
    max_clients : int, optional
        Clients per chunk of a step (memory bound).
    objective : LocalObjective, optional
        As in :func:`client_local_sgd`, anchored at each client's starting
        row; a client with no record in a step takes no step at all.
    orders : sequence of numpy.ndarray, optional
        Each client's ``[E, n_j]`` visiting orders, drawn already, instead of
        ``rngs``.

    Returns
    -------
    dict of str to torch.Tensor
        The stacked parameters after E epochs.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On mismatched counts, generators or shapes.
    dpfl.errors.NonFiniteUpdateError
        If a client's gradient is not finite.
    """
    batch_size = check_count("batch_size", batch_size, minimum=1)
    m = x_pad.shape[0]
    if (rngs is None) == (orders is None):
        raise InvalidParameterError("give exactly one of rngs and orders")
    given = rngs if rngs is not None else orders
    assert given is not None
    if len(counts) != m or len(given) != m:
        raise InvalidParameterError(
            f"counts and rngs (or orders) must have one entry per client ({m}); "
            f"got {len(counts)} and {len(given)}"
        )
    padded = pad_orders(
        [
            _orders_of(
                rngs[j] if rngs is not None else None,
                orders[j] if orders is not None else None,
                int(counts[j]),
                epochs,
            )
            for j in range(m)
        ]
    )
    plain = objective is None or type(objective) is Erm  # no regulariser
    if plain and fused_sgd_supported(model):
        return _fused_local_sgd(
            model,
            stacked_params,
            x_pad,
            y_pad,
            padded,
            batch_size=batch_size,
            learning_rate=check_positive("learning_rate", learning_rate),
            loss_fn=loss_fn,
            max_clients=max_clients,
        )
    stacked = dict(stacked_params)
    for epoch in padded:
        for batch in _batches(epoch, batch_size):
            if not (batch >= 0).any():  # no client has a record left (host check)
                continue
            idx = torch.as_tensor(batch, device=x_pad.device)
            mask = idx >= 0
            safe = idx.clamp(min=0)
            before = stacked
            stacked = cohort_sgd_step(
                model,
                stacked,
                _gather(x_pad, safe),
                _gather(y_pad, safe),
                learning_rate=learning_rate,
                loss_fn=loss_fn,
                sample_mask=mask,
                max_clients=max_clients,
            )
            if objective is not None:
                moved = mask.any(dim=1)
                for k, theta in before.items():
                    step = _regulariser_step(
                        objective, theta, stacked_params[k], learning_rate
                    )
                    if isinstance(step, torch.Tensor):
                        shape = (-1,) + (1,) * (theta.dim() - 1)
                        stacked[k] = stacked[k] - step * moved.view(shape).to(
                            step.dtype
                        )
    return stacked


def _gather(padded: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``padded[j, idx[j, i]]`` as ``[m, k, ...]``, for ``[m, n, ...]`` records.

    One ``index_select`` over the flattened rows: advanced indexing with a
    row index beside ``idx`` takes six times as long on the peer task's
    epoch (127 against 21 µs for 50 x 50 records of 64 features).
    """
    m, n = int(padded.shape[0]), int(padded.shape[1])
    rows = torch.arange(m, device=idx.device).mul_(n).unsqueeze(1)
    flat = padded.reshape(m * n, *padded.shape[2:])
    picked = flat.index_select(0, (idx + rows).reshape(-1))
    return picked.view(m, idx.shape[1], *padded.shape[2:])


def _fused_local_sgd(
    model: nn.Module,
    stacked_params: Mapping[str, torch.Tensor],
    x_pad: torch.Tensor,
    y_pad: torch.Tensor,
    orders: np.ndarray,
    *,
    batch_size: int,
    learning_rate: float,
    loss_fn: LossFn,
    max_clients: int | None,
) -> Params:
    """:func:`cohort_local_sgd` of an all-``nn.Linear`` model, with the step fused.

    The same batches and steps (each epoch's records gathered once, each
    batch copied out of it), with every step one :func:`cohort_sgd_inplace`
    into a copy of the stacked parameters. Which clients have a full batch is
    known on the host from the orders, so a step where every client has one
    takes no mask at all and nothing waits on the device; the parameters are
    checked to be finite once, at the end (a non-finite gradient leaves them
    non-finite).
    """
    m, n_max = int(orders.shape[1]), int(orders.shape[2])
    full = int((orders[0] >= 0).sum(1).min()) if m else 0  # records of the smallest
    chunk = m if max_clients is None else max_clients
    device = x_pad.device
    # Trained in contiguous [m, *shape] copies: a batched product added in
    # place into a view of a wider buffer (a parameter's columns of an [m, d]
    # buffer) goes through a temporary, 1.6 to 4 times the product's own
    # time on the peer task's layers.
    stacked = {
        k: v.detach().clone(memory_format=torch.contiguous_format)
        for k, v in stacked_params.items()
    }
    dtype = next(iter(stacked.values())).dtype
    for epoch in orders:
        idx = torch.as_tensor(np.maximum(epoch, 0), device=device)
        xe, ye = _gather(x_pad, idx), _gather(y_pad, idx)
        for start in range(0, n_max, batch_size):
            stop = min(start + batch_size, n_max)
            scale: torch.Tensor | float
            if stop <= full:  # every client has a full batch
                scale = -learning_rate / (stop - start)
            else:
                valid = epoch[:, start:stop] >= 0
                sizes = valid.sum(1)
                if not sizes.any():
                    continue
                per = valid * (-learning_rate / np.maximum(sizes, 1))[:, None]
                scale = torch.as_tensor(per.reshape(-1), device=device).to(dtype)
            cohort_sgd_inplace(
                model,
                stacked,
                # a batch's own copy: the batched products read a slice of the
                # epoch ([m, n, ...], every client's batch a block) about 15%
                # slower than the copy costs
                xe[:, start:stop].contiguous(),
                ye[:, start:stop].contiguous(),
                scale,
                loss_fn=loss_fn,
                chunk=chunk,
            )
    check_finite(stacked, "client gradient (the local model after the steps)")
    return stacked
