"""What a Ray worker is, and what crosses the wire to and from it.

:class:`RayWorker` is the actor of :class:`dpfl.integrations.ray.RayExecutor`:
it holds one replica of the algorithm it serves, built from the algorithm's
blueprint, and runs one share of a round's client steps. Tasks and messages
travel with their tensors as numpy arrays (:class:`WireArray`,
:func:`wire_task`, :func:`wire_messages` and their inverses), which Ray ships
out of band.

The blueprint names the model's and loss's classes and functions by their
modules, so a worker imports the user's code (a ``model.factory``'s module,
say) from its own environment: :func:`code_of` lists those modules with the
SHA-256 of their files on the driver, and :func:`check_code`, run by a worker
before it unpickles a blueprint, refuses a module it cannot import or whose
file differs, in one line naming it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import os
import resource
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dpfl.errors import DpflError

if TYPE_CHECKING:
    import torch

    from dpfl.sim.algorithms.base import FederatedAlgorithm, Messages
    from dpfl.sim.algorithms.tasks import Task

__all__ = [
    "RayWorker",
    "WireArray",
    "actor_class",
    "check_code",
    "code_of",
    "unwire_messages",
    "unwire_task",
    "wire_messages",
    "wire_task",
]


# -- what crosses the wire ---------------------------------------------------------
class WireArray:
    """A tensor as it travels: its values as a numpy array.

    Ray ships numpy arrays (anywhere in an object) out of band, straight
    into and out of the object store; a pickled torch tensor goes through
    torch's own serialisation, 5-8 times slower here, and a pickled *view*
    ships its whole storage (a client's row of a server table would ship the
    table). A dtype numpy lacks (bfloat16) travels as a compact tensor.
    """

    __slots__ = ("data",)

    def __init__(self, t: torch.Tensor) -> None:
        t = t.detach().cpu()
        try:
            self.data: Any = t.numpy()  # a view: ray.put copies only its bytes
        except TypeError:
            if t.untyped_storage().nbytes() != t.numel() * t.element_size():
                t = t.clone()
            self.data = t

    def __reduce__(self) -> tuple[Any, ...]:
        return (WireArray._of, (self.data,))

    @staticmethod
    def _of(data: Any) -> WireArray:
        out = WireArray.__new__(WireArray)
        out.data = data
        return out

    def tensor(self, device: str) -> torch.Tensor:
        """A writable tensor on ``device`` (what Ray hands out is read-only)."""
        import numpy as np
        import torch

        data = self.data
        if isinstance(data, np.ndarray):
            return torch.tensor(data, device=device)  # a copy
        return data.to(device)


def wire_task(task: Task) -> Task:
    """``task`` with its tensors (state, options) as :class:`WireArray`."""
    import torch

    if not task.state and not any(
        isinstance(v, torch.Tensor) for v in task.options.values()
    ):
        return task
    return dataclasses.replace(
        task,
        state={k: WireArray(v) for k, v in task.state.items()},  # type: ignore[misc]
        options={
            k: WireArray(v) if isinstance(v, torch.Tensor) else v
            for k, v in task.options.items()
        },
    )


def unwire_task(task: Task, device: str) -> Task:
    """A task off the wire, its tensors on ``device``."""
    if not task.state and not any(
        isinstance(v, WireArray) for v in task.options.values()
    ):
        return task
    return dataclasses.replace(
        task,
        state={k: v.tensor(device) for k, v in task.state.items()},  # type: ignore[attr-defined]
        options={
            k: v.tensor(device) if isinstance(v, WireArray) else v
            for k, v in task.options.items()
        },
    )


def wire_messages(messages: Messages) -> dict[str, Any]:
    """A share's messages for the wire (tensors as :class:`WireArray`)."""
    return {
        "vectors": WireArray(messages.vectors),
        "scalars": {k: WireArray(v) for k, v in messages.scalars.items()},
        "states": {k: WireArray(v) for k, v in messages.states.items()},
        "summed": messages.summed,
    }


def unwire_messages(wire: Mapping[str, Any], device: str) -> Messages:
    """A share's messages off the wire, on ``device``."""
    from dpfl.sim.algorithms.base import Messages

    return Messages(
        wire["vectors"].tensor(device),
        {k: v.tensor(device) for k, v in wire["scalars"].items()},
        summed=wire["summed"],
        states={k: v.tensor(device) for k, v in wire["states"].items()},
    )


# -- the user's code ------------------------------------------------------------------
#: Packages every worker has as the driver has them (dpfl and torch are
#: installed on every node) or that come with Python.
_INSTALLED = frozenset({"dpfl", "torch", *sys.stdlib_module_names})


def code_of(algorithm: FederatedAlgorithm) -> list[tuple[str, str]]:
    """The modules of the user's code a replica of ``algorithm`` needs.

    The modules that define the model's layers (every submodule's class) and
    the loss (its function, or its class), outside dpfl, torch and Python's
    own, each with the SHA-256 of its file here.

    Returns
    -------
    list of (str, str)
        ``(module name, sha256)``, sorted by name.
    """
    from dpfl.experiments.factory import file_sha256

    found: list[Any] = [type(m) for m in algorithm.model.modules()]
    loss = algorithm.loss_fn
    while isinstance(loss, functools.partial):
        loss = loss.func
    found.append(
        loss if inspect.isfunction(loss) or inspect.isclass(loss) else type(loss)
    )
    names = {getattr(obj, "__module__", None) for obj in found}
    out: list[tuple[str, str]] = []
    for name in sorted(n for n in names if isinstance(n, str)):
        if name.partition(".")[0] in _INSTALLED:
            continue
        path = getattr(sys.modules.get(name), "__file__", None)
        if path and str(path).endswith(".py"):
            out.append((name, file_sha256(path)))
    return out


def check_code(code: Sequence[tuple[str, str]], where: str) -> None:
    """Import each module of :func:`code_of` here; its file must be the driver's.

    Parameters
    ----------
    code : sequence of (str, str)
        :func:`code_of`'s list, from the driver.
    where : str
        This worker, as messages name it (its node's address).

    Raises
    ------
    dpfl.errors.DpflError
        One line naming the module and what to do: it cannot be imported
        here, or its file here is not the driver's.
    """
    from dpfl.experiments.factory import file_sha256

    for name, sha in code:
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            raise DpflError(
                f"a Ray worker on {where} cannot import module {name!r}, which "
                f"defines the run's model or loss ({type(exc).__name__}: {first}): "
                "every node needs it importable as the driver has it (an "
                "installed package, or its folder on PYTHONPATH when the node "
                "starts)"
            ) from None
        path = getattr(module, "__file__", None)
        if path is None or file_sha256(path) != sha:
            raise DpflError(
                f"{path} on the Ray worker on {where} is not the driver's file of "
                f"module {name!r} (its SHA-256 differs), which defines the run's "
                "model or loss: every node needs the same code; install the same "
                "version everywhere"
            )


# -- the worker ----------------------------------------------------------------------
class RayWorker:
    """A Ray actor holding one replica of the algorithm it serves.

    The replica is built from the blueprint the first time a call names it
    (and again after a restart, or when the driver moves to another
    algorithm): the constructor takes nothing Ray would have to keep for a
    restart.
    """

    def __init__(self, device: str, threads: int) -> None:
        import torch

        torch.set_num_threads(threads)
        self._device = device
        self._key: str | None = None
        self._replica: Any = None

    def info(self) -> dict[str, Any]:
        """Where this worker runs (node, address, pid, device) and its peak memory."""
        import ray

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
            "device": self._device,
            # ru_maxrss is in KiB on Linux
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }

    def client_steps(
        self,
        key: str,
        blueprint: list[Any],
        weights: WireArray,
        tasks: list[Task],
        streams: Any,
    ) -> dict[str, Any]:
        """The messages of one share (tensors as :class:`WireArray`)."""
        if self._key != key:
            import ray

            self._replica = None  # free the previous one first
            if len(blueprint) > 1:  # the user's code, before unpickling it
                check_code(blueprint[1], ray.util.get_node_ip_address())
            self._replica = ray.get(blueprint[0]).build(self._device)
            self._key = key
        tasks = [unwire_task(t, self._device) for t in tasks]
        # The keys of the share's streams (in secure mode the clients' derived
        # keys, never the run's), with generators on this device.
        mine = streams.on_device(self._device)
        out = self._replica.client_steps(weights.tensor(self._device), tasks, mine)
        return wire_messages(out)


_ACTOR_CLASSES: dict[type, Any] = {}


def actor_class(ray: Any, cls: type) -> Any:
    """The Ray actor class of worker class ``cls`` (made once per class)."""
    if cls not in _ACTOR_CLASSES:
        _ACTOR_CLASSES[cls] = ray.remote(cls)
    return _ACTOR_CLASSES[cls]
