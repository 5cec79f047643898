"""Layer rules: what the ghost and cohort kernels know of each layer type.

The ghost kernel (:mod:`dpfl.sim.grad.ghost`) never asks autograd for
parameter gradients. It records, for every layer that holds parameters, the
layer's input ``a`` and the gradient ``g`` of the summed per-example losses
with respect to the layer's output, and asks the layer's *rule* to turn them
into per-example gradients of the layer's parameters. The cohort forward
(:mod:`dpfl.sim.grad.cohort`) runs one model over the examples of many
clients at once, each client with its own parameters, and asks the rule for
the layer's forward pass with stacked per-client parameters.

A model qualifies for the ghost kernel (:func:`dpfl.sim.grad.ghost_supported`)
when it has no BatchNorm and every module holding parameters has a rule
registered for its exact type (a subclass needs its own registration: its
forward may differ) that accepts the module's configuration. Rules for
``nn.Linear`` and ``nn.Conv2d`` come with dpfl; register one for your own
layer with :func:`register_layer`, in the spirit of Opacus's
``@register_grad_sampler``.

Rule interface
--------------
Subclass :class:`LayerRule` and implement:

``records(module, a, g, saved=None) -> dict[str, Record]``
    The per-example gradient of each of the module's own parameters, by
    local name (``"weight"``, ``"bias"``, ...), for ``b`` examples along
    the first dimension of ``a`` (the layer's first positional input) and
    ``g`` (gradient of the *sum* of per-example losses at the layer's
    output). Each gradient is a record:

    :class:`PerExample` ``(grad)``
        materialised, ``[b, *param.shape]``;
    :class:`Outer` ``(g, a)``
        the outer product ``g_i a_iᵀ`` of ``g`` ``[b, out]`` and ``a``
        ``[b, in]`` (the parameter is ``[out, in]``), never materialised:
        its norm is ``‖g_i‖·‖a_i‖`` (the "ghost norm") and its clipped sum
        one matrix product.

    The kernel derives the per-example squared norms and the clipped
    (weighted) sums from the records. ``saved`` is what the rule's
    :meth:`~LayerRule.cohort_forward` returned next to its output, when the
    records follow a cohort forward pass; ``None`` otherwise.

``cohort_forward(module, x, params, m) -> (output, saved)``
    The layer applied to the flat batch ``x`` ``[m·B, ...]`` of ``m``
    clients' examples (client-major), client ``k``'s examples with client
    ``k``'s parameters ``params[name][k]`` (``params`` holds the module's
    own parameters, by local name, each ``[m, *param.shape]``). Returns the
    output and anything to hand to :meth:`~LayerRule.records` as ``saved``
    (or ``None``). Differentiable in ``x`` and ``params``.

and optionally ``unsupported(module) -> str | None``: why this instance
cannot be handled (e.g. ``"groups=2"``), or ``None`` (the default).

Everything between the layers with rules must treat each example alone (no
BatchNorm), and each such layer must be called once per forward pass;
otherwise ``method="auto"`` falls back to ``vmap``.

Example
-------
A layer scaling each feature by a learned weight, ``y = x * w``; its
per-example weight gradient is ``Σ_t a_it g_it`` over any middle positions:

>>> import torch
>>> from torch import nn
>>> from dpfl.sim.grad import clipped_grad_sum, ghost_supported
>>> from dpfl.sim.grad.layers import (
...     LayerRule, PerExample, register_layer, unregister_layer
... )
>>> class Scale(nn.Module):
...     def __init__(self, d):
...         super().__init__()
...         self.weight = nn.Parameter(torch.ones(d))
...
...     def forward(self, x):
...         return x * self.weight
>>> model = nn.Sequential(nn.Linear(4, 3), Scale(3))
>>> ghost_supported(model)
False
>>> @register_layer(Scale)
... class ScaleRule(LayerRule):
...     def records(self, module, a, g, saved=None):
...         per_example = (a * g).reshape(a.shape[0], -1, a.shape[-1]).sum(1)
...         return {"weight": PerExample(per_example)}
...
...     def cohort_forward(self, module, x, params, m):
...         w = params["weight"]  # [m, d]
...         out = x.reshape(m, -1, x.shape[-1]) * w[:, None, :]
...         return out.reshape(x.shape), None
>>> ghost_supported(model)
True
>>> x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
>>> sums = clipped_grad_sum(model, None, x, y, clip=1.0, method="ghost")
>>> sums["1.weight"].shape
torch.Size([3])
>>> unregister_layer(Scale) is not None
True
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar, cast

import torch
from torch import nn

from dpfl.errors import InvalidParameterError
from dpfl.sim.grad._conv import (
    cohort_conv2d,
    conv2d_per_sample_weight_grad,
    conv2d_weight_grad_from_columns,
)

__all__ = [
    "Conv2dRule",
    "LayerRule",
    "LinearRule",
    "ModelLayers",
    "Outer",
    "PerExample",
    "Record",
    "layer_rule",
    "model_layers",
    "register_layer",
    "sq_norm",
    "unregister_layer",
]


# ------------------------------------------------------------------- records
def sq_norm(t: torch.Tensor) -> torch.Tensor:
    """Squared L2 norm of each example's slice of ``t`` ``[b, ...]`` (one pass).

    Parameters
    ----------
    t : torch.Tensor
        Per-example tensors along the first dimension.

    Returns
    -------
    torch.Tensor
        ``[b]``.
    """
    return torch.linalg.vector_norm(t.reshape(t.shape[0], -1), dim=1).pow(2)


class PerExample(NamedTuple):
    """A materialised per-example gradient ``[b, *param.shape]``."""

    grad: torch.Tensor

    def sq_norms(self) -> torch.Tensor:
        """Per-example squared norms ``[b]``."""
        return sq_norm(self.grad)


class Outer(NamedTuple):
    """Per-example gradient ``g_i a_iᵀ`` of an ``[out, in]`` parameter, unbuilt.

    ``g`` is ``[b, out]`` and ``a`` ``[b, in]``.
    """

    g: torch.Tensor
    a: torch.Tensor

    def sq_norms(self) -> torch.Tensor:
        """Per-example squared norms ``‖a_i‖²‖g_i‖²`` (ghost norms), ``[b]``."""
        return sq_norm(self.a) * sq_norm(self.g)


#: What a rule returns per parameter.
Record = PerExample | Outer


# --------------------------------------------------------------------- rules
class LayerRule:
    """How the ghost and cohort kernels handle one layer type.

    See the module docstring for the interface; subclasses implement
    :meth:`records` and :meth:`cohort_forward`, and may override
    :meth:`unsupported`.
    """

    def unsupported(self, module: nn.Module) -> str | None:
        """Why this rule cannot handle ``module`` (its configuration), or ``None``.

        Parameters
        ----------
        module : torch.nn.Module
            A layer of the registered type.

        Returns
        -------
        str or None
            A short reason (e.g. ``"groups=2"``), or ``None`` if supported.
        """
        return None

    def records(
        self,
        module: nn.Module,
        a: torch.Tensor,
        g: torch.Tensor,
        saved: Any = None,
    ) -> dict[str, Record]:
        """Per-example gradients of the module's own parameters, by local name.

        Parameters
        ----------
        module : torch.nn.Module
            The layer.
        a : torch.Tensor
            Its input, ``[b, ...]`` (detached).
        g : torch.Tensor
            Gradient of the sum of per-example losses at its output,
            ``[b, ...]`` (detached).
        saved : object, optional
            What :meth:`cohort_forward` returned with its output, after a
            cohort forward pass; ``None`` otherwise.

        Returns
        -------
        dict of str to Record
            One record per parameter of the module (not of its children).
        """
        raise NotImplementedError

    def cohort_forward(
        self,
        module: nn.Module,
        x: torch.Tensor,
        params: Mapping[str, torch.Tensor],
        m: int,
    ) -> tuple[torch.Tensor, Any]:
        """The layer over ``m`` clients' examples, each with its own parameters.

        Parameters
        ----------
        module : torch.nn.Module
            The layer (its configuration; its own parameters are not used).
        x : torch.Tensor
            ``[m·B, ...]``, client ``k``'s examples at rows ``k·B`` to
            ``(k+1)·B − 1``.
        params : mapping of str to torch.Tensor
            The module's own parameters by local name, ``[m, *shape]`` each.
        m : int
            Number of clients.

        Returns
        -------
        tuple
            ``(output [m·B, ...], saved)``; ``saved`` is handed to
            :meth:`records` (``None`` if nothing is).
        """
        raise NotImplementedError


_RULES: dict[type[nn.Module], LayerRule] = {}
_R = TypeVar("_R", bound=LayerRule | type[LayerRule])


def register_layer(*layer_types: type[nn.Module]) -> Callable[[_R], _R]:
    """Register a rule for layers of these exact types (a decorator).

    Decorate a :class:`LayerRule` subclass (instantiated without arguments)
    or call the result on a rule instance, e.g.
    ``register_layer(MyLinear)(LinearRule())`` for a ``nn.Linear`` subclass
    whose forward is a plain linear map. A later registration for the same
    type replaces the earlier one.

    Parameters
    ----------
    *layer_types : type
        ``nn.Module`` subclasses; lookup is by exact type.

    Returns
    -------
    callable
        The decorator; it returns its argument unchanged.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If a type is not an ``nn.Module`` subclass, or the decorated object is
        not a :class:`LayerRule` (subclass or instance).
    """
    for t in layer_types:
        if not (isinstance(t, type) and issubclass(t, nn.Module)):
            raise InvalidParameterError(
                f"register_layer takes nn.Module subclasses; got {t!r}"
            )
    if not layer_types:
        raise InvalidParameterError("register_layer needs at least one layer type")

    def decorate(rule: _R) -> _R:
        if isinstance(rule, type) and issubclass(rule, LayerRule):
            instance = rule()
        elif isinstance(rule, LayerRule):
            instance = rule
        else:
            raise InvalidParameterError(
                f"register_layer registers LayerRule subclasses or instances; "
                f"got {rule!r}"
            )
        for t in layer_types:
            _RULES[t] = instance
        _MODEL_LAYERS.clear()  # cached ghost support may change
        return rule

    return decorate


def unregister_layer(layer_type: type[nn.Module]) -> LayerRule | None:
    """Remove the rule registered for ``layer_type``; return it (or ``None``).

    Parameters
    ----------
    layer_type : type
        An ``nn.Module`` subclass.

    Returns
    -------
    LayerRule or None
        The rule that was registered.
    """
    rule = _RULES.pop(layer_type, None)
    _MODEL_LAYERS.clear()
    return rule


def layer_rule(layer_type: type[nn.Module]) -> LayerRule | None:
    """The rule registered for exactly ``layer_type``, or ``None``.

    Parameters
    ----------
    layer_type : type
        An ``nn.Module`` subclass.

    Returns
    -------
    LayerRule or None
        The registered rule.
    """
    return _RULES.get(layer_type)


# ------------------------------------------------------------ model structure
@dataclasses.dataclass(frozen=True)
class ModelLayers:
    """What the kernels need to know of a model, computed once per model.

    Attributes
    ----------
    layers : tuple of (str, torch.nn.Module)
        Modules holding parameters directly, by qualified name.
    rules : dict of str to LayerRule
        The rule of each of those layers that has a usable one.
    unsupported : tuple of str
        One description per layer without a usable rule (e.g.
        ``"'net.1' (GroupNorm): no rule registered"``).
    own_params : dict of str to frozenset of str
        Local names of each layer's own parameters, by layer name.
    batchnorm : bool
        Whether the model contains BatchNorm.
    param_names : frozenset of str
        Names of all the model's parameters.
    """

    layers: tuple[tuple[str, nn.Module], ...]
    rules: dict[str, LayerRule]
    unsupported: tuple[str, ...]
    own_params: dict[str, frozenset[str]]
    batchnorm: bool
    param_names: frozenset[str]

    @property
    def ghost(self) -> bool:
        """Whether every layer has a usable rule and there is no BatchNorm."""
        return not self.unsupported and not self.batchnorm

    def unsupported_types(self) -> list[str]:
        """Type names of the layers without a usable rule, each once."""
        names = [type(m).__name__ for n, m in self.layers if n not in self.rules]
        return list(dict.fromkeys(names))


_MODEL_LAYERS: weakref.WeakKeyDictionary[nn.Module, ModelLayers] = (
    weakref.WeakKeyDictionary()
)


def model_layers(model: nn.Module) -> ModelLayers:
    """Return the model's layers, rules and ghost support (cached per model).

    The per-round hot path would otherwise walk the module tree several times
    a call. The cache assumes a model's modules do not change after first
    use; registering or removing a rule clears it.

    Parameters
    ----------
    model : torch.nn.Module
        The model.

    Returns
    -------
    ModelLayers
        Its structure.
    """
    found = _MODEL_LAYERS.get(model)
    if found is None:
        found = _inspect(model)
        _MODEL_LAYERS[model] = found
    return found


def _inspect(model: nn.Module) -> ModelLayers:
    layers = tuple(
        (name, m)
        for name, m in model.named_modules()
        if list(m.parameters(recurse=False))
    )
    rules: dict[str, LayerRule] = {}
    unsupported: list[str] = []
    for name, module in layers:
        label = f"{name or 'model'!r} ({type(module).__name__})"
        rule = _RULES.get(type(module))
        reason = "no rule registered" if rule is None else rule.unsupported(module)
        if rule is None or reason is not None:
            unsupported.append(f"{label}: {reason}")
        else:
            rules[name] = rule
    return ModelLayers(
        layers=layers,
        rules=rules,
        unsupported=tuple(unsupported),
        own_params={
            name: frozenset(k for k, v in m._parameters.items() if v is not None)
            for name, m in layers
        },
        batchnorm=any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()
        ),
        param_names=frozenset(n for n, _ in model.named_parameters()),
    )


# ----------------------------------------------------------- built-in rules
@register_layer(nn.Linear)
class LinearRule(LayerRule):
    """``nn.Linear``, on inputs ``[b, in]`` or ``[b, ..., in]``.

    Two-dimensional inputs: the weight's per-example gradient is the outer
    product ``g_i a_iᵀ`` (an :class:`Outer` record, the ghost norm of
    Goodfellow 2015 / Li et al. 2022). More dimensions: per-example weight
    gradients summed over the middle positions (one ``einsum``).
    """

    def records(
        self,
        module: nn.Module,
        a: torch.Tensor,
        g: torch.Tensor,
        saved: Any = None,
    ) -> dict[str, Record]:
        """Weight (and bias) records from the input and output gradient."""
        out: dict[str, Record] = {}
        if a.dim() == 2:
            out["weight"] = Outer(g, a)
            gb = g
        else:  # [b, ..., in]: sum over the extra positions
            b = a.shape[0]
            a3 = a.reshape(b, -1, a.shape[-1])
            g3 = g.reshape(b, -1, g.shape[-1])
            out["weight"] = PerExample(torch.einsum("bto,bti->boi", g3, a3))
            gb = g3.sum(1)
        if module.bias is not None:
            out["bias"] = PerExample(gb)
        return out

    def cohort_forward(
        self,
        module: nn.Module,
        x: torch.Tensor,
        params: Mapping[str, torch.Tensor],
        m: int,
    ) -> tuple[torch.Tensor, Any]:
        """Client ``k``'s rows of ``x`` ``[m·B, ..., in]`` through its ``w[k]``."""
        w, bias = params["weight"], params.get("bias")
        x3 = x.reshape(m, -1, x.shape[-1])
        if bias is None:
            out = torch.bmm(x3, w.transpose(1, 2))
        else:
            out = torch.baddbmm(bias.unsqueeze(1), x3, w.transpose(1, 2))
        return out.reshape(*x.shape[:-1], w.shape[1]), None


@register_layer(nn.Conv2d)
class Conv2dRule(LayerRule):
    """``nn.Conv2d`` with ``groups=1`` and zero padding given as numbers.

    Per-example weight gradients from the input and output gradient (small
    tensors; :func:`dpfl.sim.grad._conv.conv2d_per_sample_weight_grad`), or,
    after a cohort forward pass that took the im2col route, from the columns
    it kept (``saved``).
    """

    def unsupported(self, module: nn.Module) -> str | None:
        """Grouped, non-zero-padded or ``padding="same"`` convolutions."""
        conv = cast(nn.Conv2d, module)
        if conv.groups != 1:
            return f"groups={conv.groups}"
        if conv.padding_mode != "zeros":
            return f"padding_mode={conv.padding_mode!r}"
        if isinstance(conv.padding, str):
            return f"padding={conv.padding!r}"
        return None

    def records(
        self,
        module: nn.Module,
        a: torch.Tensor,
        g: torch.Tensor,
        saved: Any = None,
    ) -> dict[str, Record]:
        """Weight (and bias) per-example gradients."""
        conv = cast(nn.Conv2d, module)
        if saved is not None:
            gw = conv2d_weight_grad_from_columns(saved, g, conv.weight.shape)
        else:
            gw = conv2d_per_sample_weight_grad(conv, a, g)
        out: dict[str, Record] = {"weight": PerExample(gw)}
        if conv.bias is not None:
            out["bias"] = PerExample(g.reshape(g.shape[0], g.shape[1], -1).sum(2))
        return out

    def cohort_forward(
        self,
        module: nn.Module,
        x: torch.Tensor,
        params: Mapping[str, torch.Tensor],
        m: int,
    ) -> tuple[torch.Tensor, Any]:
        """Per-client convolution; ``saved`` holds the im2col columns, if any."""
        conv = cast(nn.Conv2d, module)
        return cohort_conv2d(conv, x, params["weight"], params.get("bias"), m)
