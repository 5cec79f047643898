"""Server optimisers: how the server turns a round's (noisy) average update into a step.

A federated round ends with the server holding Δ_t, the round's average client
update (for a private algorithm, the *noisy* average that the round released).
A server optimiser maps Δ_t to a direction ``s_t`` and the server takes the
step ``w_{t+1} = w_t + η s_t`` (η: the algorithm's ``server_learning_rate``).
This is the FedOpt framework of Reddi et al. (2021, Algorithm 2), with Δ_t
used as a pseudo-gradient:

``sgd`` (default)
    ``s_t = Δ_t``: plain FedAvg's server step (McMahan et al. 2017).
``momentum`` (FedAvgM; Hsu, Qi & Brown 2019)
    ``v_t = β v_{t-1} + Δ_t``, ``s_t = v_t``. Option ``momentum`` = β in [0, 1)
    (default 0.9).
``adagrad`` (FedAdagrad), ``adam`` (FedAdam), ``yogi`` (FedYogi)
    ``m_t = β₁ m_{t-1} + (1 − β₁) Δ_t`` and ``s_t = m_t / (√v_t + τ)`` with

    * Adagrad: ``v_t = v_{t-1} + Δ_t²``;
    * Adam: ``v_t = β₂ v_{t-1} + (1 − β₂) Δ_t²``;
    * Yogi: ``v_t = v_{t-1} − (1 − β₂) Δ_t² sign(v_{t-1} − Δ_t²)``;

    all coordinate-wise, ``m_{-1} = 0`` and ``v_{-1} = τ²`` as in Reddi et
    al.'s experiments, no bias correction (their Algorithm 2). Options
    ``beta1`` in [0, 1) (default 0.9; Adagrad default 0, the classic method),
    ``beta2`` in [0, 1) (default 0.99; not Adagrad), and ``tau`` > 0, the
    adaptivity τ (default 1e-3; Reddi et al. tune it over 1e-5..1e-1).

**Privacy.** A server optimiser reads only the released (noisy) aggregate
and its own state, which is built from earlier releases: it is
post-processing, so it changes no guarantee. The accounting event of a round,
the ledger and every reported ε are the same whichever optimiser is chosen
(``tests/sim/test_server_opt.py`` checks the ledgers are identical).

An optimiser is chosen in the algorithm's parameters, e.g.
``server_optimizer: {name: adam, beta1: 0.9, beta2: 0.99, tau: 0.001}``
with ``server_learning_rate`` as η; :func:`check_server_optimizer` validates
such a mapping and :func:`make_server_optimizer` builds it.

References
----------
Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar & McMahan, "Adaptive
Federated Optimization", ICLR 2021, Algorithm 2. Hsu, Qi & Brown, "Measuring
the effects of non-identical data distribution for federated visual
classification", 2019 (FedAvgM).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from dpfl._validate import check_positive, check_probability
from dpfl.errors import InvalidParameterError

__all__ = [
    "SERVER_OPTIMIZERS",
    "Adagrad",
    "Adam",
    "Momentum",
    "ServerOptimizer",
    "Sgd",
    "Yogi",
    "check_server_optimizer",
    "make_server_optimizer",
]


class ServerOptimizer:
    """Base of the server optimisers: Δ_t → the direction of the server's step.

    Subclasses declare their options (:attr:`defaults`) and implement
    :meth:`direction`; their state is a dict of tensors shaped like the
    weights (:meth:`state_dict`).
    """

    #: Registered name (``server_optimizer.name``).
    name: ClassVar[str]
    #: Options and their defaults.
    defaults: ClassVar[dict[str, float]] = {}

    def __init__(self, **options: float) -> None:
        self.options = {**self.defaults, **options}
        self.state: dict[str, torch.Tensor] = {}

    @classmethod
    def check(cls, options: Mapping[str, Any]) -> dict[str, float]:
        """Validated options (unknown names and out-of-domain values raise).

        Raises
        ------
        dpfl.errors.InvalidParameterError
            Naming the option, its constraint and the value.
        """
        unknown = sorted(set(options) - set(cls.defaults))
        if unknown:
            raise InvalidParameterError(
                f"server_optimizer {cls.name!r} does not take option(s) {unknown}; "
                f"it takes {sorted(cls.defaults)}"
            )
        out = {**cls.defaults, **options}
        for key in out:
            label = f"server_optimizer.{key}"
            if key == "tau":
                out[key] = check_positive(label, out[key])
            else:  # the decay rates β, β₁, β₂ lie in [0, 1)
                out[key] = check_probability(
                    label, out[key], allow_zero=True, allow_one=False
                )
        return out

    def direction(self, delta: torch.Tensor) -> torch.Tensor:
        """The direction ``s_t`` for the average update ``delta`` (updates state)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The optimiser's state (CPU copies)."""
        return {k: v.detach().cpu().clone() for k, v in self.state.items()}

    def load_state_dict(
        self, state: Mapping[str, torch.Tensor], like: torch.Tensor
    ) -> None:
        """Restore :meth:`state_dict` onto ``like``'s device and dtype.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            If a moment's shape differs from the weights'.
        """
        loaded = {}
        for key, value in state.items():
            if tuple(value.shape) != tuple(like.shape):
                raise InvalidParameterError(
                    f"server optimiser state {key!r} has shape {tuple(value.shape)}; "
                    f"the model has {tuple(like.shape)} weights"
                )
            loaded[key] = value.to(device=like.device, dtype=like.dtype).clone()
        self.state = loaded

    def __repr__(self) -> str:
        """Return the name and options."""
        opts = ", ".join(f"{k}={v:g}" for k, v in self.options.items())
        return f"{type(self).__name__}({opts})"


SERVER_OPTIMIZERS: dict[str, type[ServerOptimizer]] = {}


def _register(cls: type[ServerOptimizer]) -> type[ServerOptimizer]:
    SERVER_OPTIMIZERS[cls.name] = cls
    return cls


@_register
class Sgd(ServerOptimizer):
    """``s_t = Δ_t`` (stateless): the plain FedAvg server step."""

    name = "sgd"

    def direction(self, delta: torch.Tensor) -> torch.Tensor:
        """``delta`` itself."""
        return delta


@_register
class Momentum(ServerOptimizer):
    """FedAvgM: ``v_t = β v_{t-1} + Δ_t``, ``s_t = v_t``."""

    name = "momentum"
    defaults: ClassVar[dict[str, float]] = {"momentum": 0.9}

    def direction(self, delta: torch.Tensor) -> torch.Tensor:
        """Update and return the velocity."""
        v = self.state.get("velocity")
        if v is None:
            v = self.state["velocity"] = torch.zeros_like(delta)
        torch.add(delta, v, alpha=self.options["momentum"], out=v)
        return v


class _Adaptive(ServerOptimizer):
    """FedOpt's adaptive family: ``s_t = m_t / (√v_t + τ)``."""

    defaults: ClassVar[dict[str, float]] = {"beta1": 0.9, "beta2": 0.99, "tau": 1e-3}

    def _second_moment(self, v: torch.Tensor, sq: torch.Tensor) -> None:
        raise NotImplementedError

    def direction(self, delta: torch.Tensor) -> torch.Tensor:
        """Update the moments and return ``m_t / (√v_t + τ)``."""
        tau = self.options["tau"]
        if "m" not in self.state:
            self.state["m"] = torch.zeros_like(delta)
            self.state["v"] = torch.full_like(delta, tau * tau)
        m, v = self.state["m"], self.state["v"]
        b1 = self.options["beta1"]
        m.mul_(b1).add_(delta, alpha=1.0 - b1)
        self._second_moment(v, delta * delta)
        return m / (v.sqrt() + tau)


@_register
class Adagrad(_Adaptive):
    """FedAdagrad: ``v_t = v_{t-1} + Δ_t²``."""

    name = "adagrad"
    defaults: ClassVar[dict[str, float]] = {"beta1": 0.0, "tau": 1e-3}

    def _second_moment(self, v: torch.Tensor, sq: torch.Tensor) -> None:
        v.add_(sq)


@_register
class Adam(_Adaptive):
    """FedAdam: ``v_t = β₂ v_{t-1} + (1 − β₂) Δ_t²``."""

    name = "adam"

    def _second_moment(self, v: torch.Tensor, sq: torch.Tensor) -> None:
        b2 = self.options["beta2"]
        v.mul_(b2).add_(sq, alpha=1.0 - b2)


@_register
class Yogi(_Adaptive):
    """FedYogi: ``v_t = v_{t-1} − (1 − β₂) Δ_t² sign(v_{t-1} − Δ_t²)``."""

    name = "yogi"

    def _second_moment(self, v: torch.Tensor, sq: torch.Tensor) -> None:
        b2 = self.options["beta2"]
        v.sub_(torch.sign(v - sq) * sq, alpha=1.0 - b2)


def check_server_optimizer(spec: object) -> dict[str, Any]:
    """A validated ``server_optimizer`` mapping, with every option filled in.

    Parameters
    ----------
    spec : mapping or None
        ``{"name": ..., **options}``; ``None`` is ``{"name": "sgd"}``.

    Returns
    -------
    dict
        The name and all its options (defaults filled in).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``spec`` is not a mapping with a known ``name``, or an option is
        unknown or out of its domain (the message names it, its constraint and
        the value).
    """
    if spec is None:
        spec = {"name": "sgd"}
    if not isinstance(spec, Mapping):
        raise InvalidParameterError(
            f"server_optimizer must be a mapping {{name: ..., options}}; got {spec!r}"
        )
    options = dict(spec)
    name = options.pop("name", None)
    if not isinstance(name, str) or name not in SERVER_OPTIMIZERS:
        raise InvalidParameterError(
            f"server_optimizer.name must be one of {sorted(SERVER_OPTIMIZERS)}; "
            f"got {name!r}"
        )
    return {"name": name, **SERVER_OPTIMIZERS[name].check(options)}


def make_server_optimizer(spec: object) -> ServerOptimizer:
    """The server optimiser of a ``server_optimizer`` mapping (validated).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        As :func:`check_server_optimizer`.
    """
    options = check_server_optimizer(spec)
    return SERVER_OPTIMIZERS[options.pop("name")](**options)
