"""The shape of every federated algorithm: parameters, a client step, a server step.

An algorithm is

* a frozen, validated :class:`AlgorithmParams` dataclass: its hyper-parameters,
  which *is* the ``algorithm.params`` section of a run configuration;
* :meth:`FederatedAlgorithm.round_event`: a pure function of the parameters,
  the data's statistics and σ giving the accounting event of one round (the
  event of the sampler and privatizer the round uses; no model is built, so
  calibration needs no torch work);
* :meth:`FederatedAlgorithm.select`: the server picks the round's
  participants and their work (a :class:`~dpfl.sim.algorithms.tasks.Cohort` of
  :class:`~dpfl.sim.algorithms.tasks.Task`), with the
  server's generators;
* :meth:`FederatedAlgorithm.client_step`: one client's work from the global
  weights, its data and its *own* generators (:mod:`dpfl.sim.randomness`) to
  a :class:`~dpfl.sim.algorithms.tasks.Message`;
  :meth:`FederatedAlgorithm.client_steps` does the whole
  cohort as one vectorised computation and must give the same messages;
* :meth:`FederatedAlgorithm.server_step`: aggregate, privatize and update the
  global state from the stacked :class:`Messages`.

The :class:`~dpfl.sim.loop.Trainer` drives the round; an executor
(:mod:`dpfl.sim.executors`) decides whether client steps run one at a time or
batched. What every algorithm shares (the flat weights, the model's data,
evaluation, state) lives here once.

Register an algorithm with :func:`~dpfl.sim.algorithms.registry.register`;
:data:`~dpfl.sim.algorithms.registry.ALGORITHMS` is the only list of
algorithm names.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from dpfl._validate import check_count, check_nonnegative
from dpfl.data.dataset import FederatedDataset
from dpfl.errors import DpflError, InvalidParameterError
from dpfl.models.losses import classification_loss
from dpfl.sim.algorithms.privacy import PrivacyHooks
from dpfl.sim.algorithms.registry import Blueprint
from dpfl.sim.algorithms.tasks import Cohort, Message, Task
from dpfl.sim.evaluation import evaluate_model
from dpfl.sim.grad import check_finite
from dpfl.sim.local import client_local_sgd, cohort_local_sgd, pad_cohort
from dpfl.sim.objectives import LocalObjective
from dpfl.sim.randomness import Streams, cohort_epoch_orders
from dpfl.sim.server_opt import ServerOptimizer, make_server_optimizer

__all__ = [
    "AlgorithmParams",
    "DataStats",
    "FederatedAlgorithm",
    "Messages",
]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
_STATE_FORMAT = 2


# -- parameters and data statistics -----------------------------------------------
@dataclasses.dataclass(frozen=True)
class AlgorithmParams:
    """Base of every algorithm's parameters (frozen; validated in ``__post_init__``).

    A subclass declares its fields with type hints and defaults (the run
    configuration reads them from there) and validates them with the checks
    of :mod:`dpfl._validate`, storing the coerced values with :meth:`_set`.
    """

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (YAML/JSON ready).

        A ``server_optimizer`` that is the default plain SGD step is left
        out, so the configuration (and the digest of a run folder) of a run
        with the default server step is what it was before server optimisers
        were a parameter, and such runs still resume.
        """
        out = dataclasses.asdict(self)
        if out.get("server_optimizer") == {"name": "sgd"}:
            del out["server_optimizer"]
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class DataStats:
    """What accounting needs to know of the data: how many clients and records.

    Attributes
    ----------
    num_clients : int
        Clients in the federation.
    client_sizes : numpy.ndarray
        Training records held by each client: a read-only int64 array (any
        sequence of counts is taken and converted; 8 bytes a client).
    """

    num_clients: int
    client_sizes: np.ndarray

    def __post_init__(self) -> None:
        sizes = np.array(self.client_sizes, dtype=np.int64)  # our own copy
        sizes.setflags(write=False)
        object.__setattr__(self, "client_sizes", sizes)

    @classmethod
    def of(cls, dataset: FederatedDataset) -> DataStats:
        """The statistics of ``dataset``."""
        sizes = dataset.client_sizes()
        return cls(num_clients=len(sizes), client_sizes=sizes)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DataStats):
            return NotImplemented
        return self.num_clients == other.num_clients and bool(
            np.array_equal(self.client_sizes, other.client_sizes)
        )

    def __hash__(self) -> int:
        return hash((self.num_clients, self.client_sizes.tobytes()))

    @property
    def sizes(self) -> np.ndarray:
        """``client_sizes`` (an int64 array)."""
        return self.client_sizes

    @functools.cached_property
    def num_records(self) -> int:
        """Training records over all clients."""
        return int(self.client_sizes.sum())

    @functools.cached_property
    def largest(self) -> int:
        """The largest client's number of records."""
        return int(self.client_sizes.max()) if self.client_sizes.size else 0


@dataclasses.dataclass
class Messages:
    """A cohort's messages, stacked in task order.

    Every tensor of a ``Messages`` lives on one device, the device of its
    ``vectors`` (:attr:`device`): the per-client ``scalars`` (float64) and
    the ``states`` too. Client steps build them there (:meth:`stack` does);
    messages computed elsewhere (a replica on another device, a remote
    worker) are moved with :meth:`to`, and the
    :class:`~dpfl.sim.loop.Trainer` hands the server step its messages on
    the algorithm's device.

    Attributes
    ----------
    vectors : torch.Tensor
        ``[clients, d]``, row ``j`` from task ``j``; or, when ``summed``,
        ``[1, d]``: their sum (a batched path whose server uses only the sum
        need not form the rows).
    scalars : dict of str to torch.Tensor
        ``[clients]`` per name (``[1]``, summed, when ``summed``), float64.
    summed : bool
        Whether ``vectors`` and ``scalars`` hold the cohort's sums.
    states : dict of str to torch.Tensor
        The clients' new held states, ``[clients, ...]`` per name, in task
        order (never summed).
    """

    vectors: torch.Tensor
    scalars: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    summed: bool = False
    states: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    @property
    def device(self) -> torch.device:
        """The device of the messages (that of ``vectors``)."""
        return self.vectors.device

    def to(self, device: str | torch.device) -> Messages:
        """These messages with every tensor on ``device`` (``self`` if all are)."""
        device = torch.device(device)
        tensors = [self.vectors, *self.scalars.values(), *self.states.values()]
        if all(t.device == device for t in tensors):
            return self
        return Messages(
            self.vectors.to(device),
            {k: v.to(device) for k, v in self.scalars.items()},
            summed=self.summed,
            states={k: v.to(device) for k, v in self.states.items()},
        )

    @classmethod
    def stack(cls, messages: Sequence[Message], like: torch.Tensor) -> Messages:
        """Stack per-client messages (``like``: a ``[d]`` template for none).

        Scalars and states go to the vectors' device.
        """
        if not messages:
            return cls(like.new_zeros(0, like.numel()), {})
        vectors = torch.stack([m.vector for m in messages])
        device = vectors.device
        names = messages[0].scalars.keys()
        return cls(
            vectors,
            {
                k: torch.tensor(
                    [float(m.scalars[k]) for m in messages],
                    dtype=torch.float64,
                    device=device,
                )
                for k in names
            },
            states={
                k: torch.stack([m.state[k].to(device) for m in messages])
                for k in messages[0].state
            },
        )

    @classmethod
    def concat(cls, parts: Sequence[Messages]) -> Messages:
        """Join the messages of consecutive shares of one cohort, in order.

        Summed shares are added (the cohort's sum); per-client shares are
        concatenated. Empty shares are skipped. The result is on the first
        share's device.

        Raises
        ------
        dpfl.errors.DpflError
            If ``parts`` is empty, or mixes summed and per-client shares.
        """
        if not parts:
            raise DpflError("Messages.concat needs at least one share")
        summed = {p.summed for p in parts}
        if len(summed) != 1:
            raise DpflError("cannot join summed and per-client messages")
        if len(parts) == 1:
            return parts[0]
        parts = [p.to(parts[0].device) for p in parts]
        if parts[0].summed:
            return cls(
                torch.stack([p.vectors for p in parts]).sum(dim=0),
                {
                    k: torch.stack([p.scalars[k] for p in parts]).sum(dim=0)
                    for k in parts[0].scalars
                },
                summed=True,
                states={
                    k: torch.cat([p.states[k] for p in parts]) for k in parts[0].states
                },
            )
        kept = [p for p in parts if p.vectors.shape[0] > 0] or [parts[0]]
        return cls(
            torch.cat([p.vectors for p in kept]),
            {k: torch.cat([p.scalars[k] for p in kept]) for k in kept[0].scalars},
            states={k: torch.cat([p.states[k] for p in kept]) for k in kept[0].states},
        )

    def total(self) -> torch.Tensor:
        """The sum of the vectors, ``[d]``."""
        return self.vectors[0] if self.summed else self.vectors.sum(dim=0)

    def scalar_total(self, name: str) -> float:
        """The sum of one named scalar over the cohort."""
        return float(self.scalars[name].sum())


# -- the algorithm ----------------------------------------------------------------
class FederatedAlgorithm(PrivacyHooks):
    """Base of the federated algorithms: holds the model, data and shared parts.

    What a round needs is here: the round contract (:meth:`setup`,
    :meth:`select`, :meth:`client_step`, :meth:`client_steps`,
    :meth:`server_step`, :meth:`held_state`, :meth:`extra_state`), the
    server's last two seams (:meth:`server_update`: the server optimiser,
    then :meth:`apply_update`) and the weights toolkit. What privacy needs
    (``round_event`` and the other accounting hooks) is inherited from
    :class:`~dpfl.sim.algorithms.privacy.PrivacyHooks`.

    The global model's parameters are views into one flat buffer,
    :attr:`weights` (``[d]``), so server updates are single operations.

    Parameters
    ----------
    params : AlgorithmParams
        The algorithm's own parameters (its ``Params`` class).
    model : torch.nn.Module
        The model to train (moved to ``device``; trained in place).
    dataset : FederatedDataset
        The federated data; its test set is used by :meth:`evaluate`.
    noise_multiplier : float
        σ, the run's one noise multiplier (``privacy.noise_multiplier``); 0 is
        the non-private run (no noise, :meth:`event` is ``None``). What σ
        scales is the algorithm's to say (its ``round_event``).
    device : str
        Torch device.
    max_clients : int or None
        Clients per chunk of a batched computation (memory bound).
    eval_batch_size : int
        Batch size of :meth:`evaluate`.
    loss_fn : callable
        ``loss_fn(output, target)``, mean over the batch; by default softmax
        cross-entropy, or binary cross-entropy for a one-logit model
        (:func:`dpfl.models.classification_loss`).

    Attributes
    ----------
    diagnostics : bool
        Whether the next server step also computes the round's diagnostics
        (extra metrics that cost passes over the cohort's updates, e.g.
        DP-FedAvg's between-client variance); ``False`` by default. The
        :class:`~dpfl.sim.loop.Trainer` sets it for the rounds it evaluates
        (or every round, when built with ``diagnostics=True``).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On a bad argument (the message names it).
    """

    #: Registered name (``algorithm.name`` in a configuration).
    name: ClassVar[str]
    #: The parameters' dataclass.
    Params: ClassVar[type[AlgorithmParams]]

    def __init__(
        self,
        params: AlgorithmParams,
        *,
        model: nn.Module,
        dataset: FederatedDataset,
        noise_multiplier: float = 0.0,
        device: str = "cpu",
        max_clients: int | None = None,
        eval_batch_size: int = 1024,
        loss_fn: LossFn = classification_loss,
    ) -> None:
        if not isinstance(params, self.Params):
            raise InvalidParameterError(
                f"params must be {self.Params.__qualname__}; got "
                f"{type(params).__name__}"
            )
        if not isinstance(model, nn.Module):
            raise InvalidParameterError(
                f"model must be a torch.nn.Module; got {type(model).__name__}"
            )
        if not isinstance(dataset, FederatedDataset):
            raise InvalidParameterError(
                f"dataset must be a FederatedDataset; got {type(dataset).__name__}"
            )
        self.params = params
        self.noise_multiplier = check_nonnegative("noise_multiplier", noise_multiplier)
        self.private = self.noise_multiplier > 0
        self.device = str(device)
        self.max_clients = (
            None
            if max_clients is None
            else check_count("max_clients", max_clients, minimum=1)
        )
        self.eval_batch_size = check_count(
            "eval_batch_size", eval_batch_size, minimum=1
        )
        self.loss_fn = loss_fn
        self.dataset = dataset
        self.diagnostics = False
        self._blueprint_args = {
            "noise_multiplier": self.noise_multiplier,
            "max_clients": self.max_clients,
            "eval_batch_size": self.eval_batch_size,
            "loss_fn": loss_fn,
        }
        self.stats = DataStats.of(dataset)
        if self.stats.num_records == 0:
            raise InvalidParameterError("dataset has no training records")
        self.model = model.to(self.device)
        self.weights = self._flatten_model()
        # Parameters with a ``server_optimizer`` field choose it; others step by SGD.
        self.server_optimizer: ServerOptimizer = make_server_optimizer(
            getattr(params, "server_optimizer", None)
        )
        self.setup()

    def _flatten_model(self) -> torch.Tensor:
        """Re-point the model's parameters at views of one flat buffer."""
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        if not named:
            raise InvalidParameterError("model has no trainable parameters")
        dtypes = {p.dtype for _, p in named}
        if len(dtypes) != 1:
            raise InvalidParameterError(
                f"model parameters must share one dtype; got {sorted(map(str, dtypes))}"
            )
        self.shapes = {n: tuple(p.shape) for n, p in named}
        flat = torch.cat([p.detach().reshape(-1) for _, p in named])
        views = self.unflatten(flat)
        with torch.no_grad():
            for n, p in named:
                p.data = views[n]
        return flat

    def blueprint(self) -> Blueprint:
        """What builds a replica of this algorithm elsewhere (picklable).

        A replica has the same parameters, data, σ and model structure, and
        computes the same client messages from the same weights, task and
        streams (client steps read mutable facts only from their
        :class:`Task`), so a worker builds one once and reuses it every round.
        """
        return Blueprint(
            algorithm=type(self).name,
            params=self.params,
            model=copy.deepcopy(self.model).cpu(),
            dataset=self.dataset,
            options=dict(self._blueprint_args),
            device=self.device,
        )

    # -- shared helpers ------------------------------------------------------------
    @property
    def num_weights(self) -> int:
        """d: trainable parameters of the model."""
        return int(self.weights.numel())

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of ``flat`` ``[..., d]`` shaped as the parameters ``[..., *shape]``."""
        lead = tuple(flat.shape[:-1])
        out: dict[str, torch.Tensor] = {}
        offset = 0
        for n, shape in self.shapes.items():
            size = int(np.prod(shape, dtype=np.int64))
            out[n] = flat[..., offset : offset + size].reshape(*lead, *shape)
            offset += size
        return out

    def flatten(
        self, tensors: Mapping[str, torch.Tensor], lead: int = 0
    ) -> torch.Tensor:
        """A ``[..., d]`` tensor from parameter-shaped tensors (``lead`` dims first)."""
        return torch.cat(
            [t.reshape(*t.shape[:lead], -1) for t in (tensors[n] for n in self.shapes)],
            dim=-1,
        )

    def client_data(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Features and labels of dataset ``rows`` as tensors on the device."""
        x, y = self.dataset.take(np.asarray(rows, dtype=np.int64))
        return (
            torch.as_tensor(np.ascontiguousarray(x)).to(self.device),
            torch.as_tensor(np.ascontiguousarray(y)).to(self.device),
        )

    def client_rows(self, client: int) -> np.ndarray:
        """Global dataset rows of ``client``'s training records."""
        return np.asarray(self.dataset.client_indices[client], dtype=np.int64)

    def local_sgd_update(
        self,
        weights: torch.Tensor,
        task: Task,
        streams: Streams,
        *,
        epochs: int,
        batch_size: int,
        learning_rate: float,
        objective: LocalObjective | None = None,
    ) -> tuple[torch.Tensor, int]:
        """One client's E epochs of local SGD from ``weights``: its update and size.

        The reference of :meth:`local_sgd_updates` (orders from the client's
        own streams, :meth:`~dpfl.sim.randomness.Streams.epoch_orders`;
        :func:`dpfl.sim.local.client_local_sgd`).
        """
        x, y = self.client_data(self.client_rows(task.client))
        final = client_local_sgd(
            self.model,
            self.unflatten(weights),
            x,
            y,
            orders=streams.epoch_orders(int(x.shape[0]), epochs),
            epochs=epochs,
            batch_size=batch_size,
            learning_rate=learning_rate,
            loss_fn=self.loss_fn,
            objective=objective,
        )
        return self.flatten(final) - weights, int(x.shape[0])

    def local_sgd_updates(
        self,
        weights: torch.Tensor,
        tasks: Sequence[Task],
        streams: Sequence[Streams],
        *,
        epochs: int,
        batch_size: int,
        learning_rate: float,
        objective: LocalObjective | None = None,
    ) -> tuple[torch.Tensor, list[int]]:
        """The cohort's local SGD as one batched computation: ``[m, d]`` updates, sizes.

        Row ``j`` equals :meth:`local_sgd_update` of task ``j`` up to float
        rounding (:func:`dpfl.sim.local.cohort_local_sgd`).
        """
        rows = [self.client_rows(t.client) for t in tasks]
        counts = [len(r) for r in rows]
        x, y = self.client_data(np.concatenate(rows))
        x_pad, y_pad = pad_cohort(x, y, counts)
        # the clients start from views of the weights (no copy: the training
        # makes its own); their updates are the rows of one [m, d] buffer
        m = len(tasks)
        final = cohort_local_sgd(
            self.model,
            self.unflatten(weights.expand(m, -1)),
            x_pad,
            y_pad,
            counts,
            orders=cohort_epoch_orders(streams, counts, epochs),
            epochs=epochs,
            batch_size=batch_size,
            learning_rate=learning_rate,
            loss_fn=self.loss_fn,
            max_clients=self.max_clients,
            objective=objective,
        )
        flat = weights.new_empty((m, weights.shape[-1]))
        start, updates = self.unflatten(weights), self.unflatten(flat)
        for name, theta in final.items():
            torch.sub(theta, start[name], out=updates[name])
        return flat, counts

    # -- the server's last seams: optimiser, then apply -------------------------------
    def server_update(
        self, delta: torch.Tensor, *, learning_rate: float = 1.0
    ) -> torch.Tensor:
        """The server optimiser's step from the round's (noisy) average ``delta``.

        ``w += learning_rate · s``, ``s`` the direction :attr:`server_optimizer`
        makes of ``delta`` (``delta`` itself for the default SGD;
        :mod:`dpfl.sim.server_opt`). It reads only the released aggregate and
        its own state, so it is post-processing: it changes no guarantee.

        Returns
        -------
        torch.Tensor
            The direction ``s`` (``[d]``).

        Raises
        ------
        dpfl.errors.NonFiniteUpdateError
            If ``delta`` holds NaN or Inf; the weights and the optimiser's
            state are unchanged.
        """
        check_finite({"update": delta}, "model update")
        step = self.server_optimizer.direction(delta.to(self.weights.dtype))
        self.apply_update(step, scale=learning_rate)
        return step

    def apply_update(self, delta: torch.Tensor, *, scale: float = 1.0) -> None:
        """``weights += scale · delta``, after checking ``delta`` is finite.

        Raises
        ------
        dpfl.errors.NonFiniteUpdateError
            If ``delta`` holds NaN or Inf; the weights are unchanged.
        """
        check_finite({"update": delta}, "model update")
        self.weights.add_(delta.to(self.weights.dtype), alpha=scale)

    # -- the round --------------------------------------------------------------------
    def held_state(self, client: int) -> dict[str, torch.Tensor]:
        """What ``client`` holds between rounds, as the server's copy has it.

        Sent as :attr:`Task.state`; the default is nothing (a stateless
        client). An algorithm with client state overrides it and commits the
        messages' new ``states`` in its server step.
        """
        return {}

    def setup(self) -> None:  # noqa: B027  (optional hook)
        """Build the algorithm's own state (called at the end of ``__init__``)."""

    @abc.abstractmethod
    def select(self, round_index: int, server: Streams) -> Cohort:
        """The server picks the round's participants and hands out their tasks."""

    @abc.abstractmethod
    def client_step(
        self, weights: torch.Tensor, task: Task, streams: Streams
    ) -> Message:
        """One client's work: the reference the batched path is checked against."""

    def client_steps(
        self, weights: torch.Tensor, tasks: Sequence[Task], streams: Sequence[Streams]
    ) -> Messages:
        """The cohort's work as one computation; default: one client at a time."""
        return Messages.stack(
            [self.client_step(weights, t, s) for t, s in zip(tasks, streams)],
            weights,
        )

    @abc.abstractmethod
    def server_step(
        self, cohort: Cohort, messages: Messages, server: Streams
    ) -> dict[str, float]:
        """Aggregate, privatize and update the global state; return round metrics.

        Must check the update is finite before changing any state (see
        :meth:`apply_update`).
        """

    # -- evaluation and state ---------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Mean loss and accuracy of the global model on the test set."""
        return evaluate_model(
            self.model,
            self.dataset.test_features,
            self.dataset.test_labels,
            loss_fn=self.loss_fn,
            batch_size=self.eval_batch_size,
            device=self.device,
        )

    def extra_state(self) -> dict[str, Any]:
        """The algorithm's state besides the model (CPU tensors or plain data)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:  # noqa: B027
        """Restore :meth:`extra_state`."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training exactly (CPU copies)."""
        return {
            "format": _STATE_FORMAT,
            "name": self.name,
            "model": {
                k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()
            },
            "extra": self.extra_state(),
            "server_optimizer": self.server_optimizer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            If the state belongs to another algorithm or model.
        """
        if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
            raise InvalidParameterError(
                "state is not a dpfl algorithm state (format 2)"
            )
        if state.get("name") != self.name:
            raise InvalidParameterError(
                f"state is for algorithm {state.get('name')!r}, not {self.name!r}"
            )
        try:
            self.model.load_state_dict(state["model"])
        except RuntimeError as exc:
            raise InvalidParameterError(
                f"state's model does not match this model: {exc}"
            ) from None
        self.load_extra_state(state["extra"])
        self.server_optimizer.load_state_dict(
            state.get("server_optimizer", {}), like=self.weights
        )

    def __repr__(self) -> str:
        """Return the name, σ and parameters."""
        return f"{type(self).__name__}(σ={self.noise_multiplier:g}, {self.params})"
