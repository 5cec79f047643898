"""Public/private split of a model's parameters (MS-PAFL).

MS-PAFL keeps a *private* sub-model on the device and clips, noises and
aggregates only the *public* one. The split is described on the flat parameter
vector, the concatenation of every parameter flattened row-major in
``named_parameters`` order, so that a split may cut through a tensor: the
paper's logistic regression keeps "the first half of the coordinates" private
and sends the second half (docs/analyses.md; ms-pafl §V-A).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from dpfl._validate import check_count, check_probability
from dpfl.errors import InvalidParameterError

__all__ = ["ParameterSplit", "split_parameters"]


@dataclass(frozen=True, eq=False)
class ParameterSplit:
    """Index masks of the private and public coordinates of a flat vector.

    Parameters
    ----------
    names : tuple of str
        Parameter names, in flattening order.
    shapes : tuple of torch.Size
        Shape of each parameter (without any batch dimension).
    private_mask : torch.Tensor
        Boolean vector of length ``sum(numel)``; ``True`` marks a private
        coordinate (kept on the device), ``False`` a public one (sent).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If the lengths of ``names``, ``shapes`` and ``private_mask`` disagree.
    """

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    private_mask: torch.Tensor

    def __post_init__(self) -> None:
        if len(self.names) != len(self.shapes):
            raise InvalidParameterError(
                f"names and shapes must have the same length; got {len(self.names)} "
                f"and {len(self.shapes)}"
            )
        mask = self.private_mask
        if mask.dtype != torch.bool or mask.dim() != 1:
            raise InvalidParameterError(
                f"private_mask must be a 1-d bool tensor; got {mask.dtype} of "
                f"shape {tuple(mask.shape)}"
            )
        total = sum(math.prod(s) for s in self.shapes)
        if mask.numel() != total:
            raise InvalidParameterError(
                f"private_mask must have {total} entries (one per coordinate); "
                f"got {mask.numel()}"
            )

    @property
    def num_parameters(self) -> int:
        """Length of the flat parameter vector."""
        return int(self.private_mask.numel())

    @property
    def private_index(self) -> torch.Tensor:
        """Positions of the private coordinates in the flat vector."""
        return torch.nonzero(self.private_mask).flatten()

    @property
    def public_index(self) -> torch.Tensor:
        """Positions of the public coordinates in the flat vector."""
        return torch.nonzero(~self.private_mask).flatten()

    @property
    def num_private(self) -> int:
        """Number of private coordinates."""
        return int(self.private_mask.sum())

    @property
    def num_public(self) -> int:
        """Number of public coordinates (``d_pub``)."""
        return self.num_parameters - self.num_private

    def _names_where(self, private: bool) -> tuple[str, ...]:
        out = []
        start = 0
        for name, shape in zip(self.names, self.shapes):
            n = math.prod(shape)
            part = self.private_mask[start : start + n]
            if bool((part if private else ~part).any()):
                out.append(name)
            start += n
        return tuple(out)

    @property
    def private_names(self) -> tuple[str, ...]:
        """Names of parameters with at least one private coordinate."""
        return self._names_where(True)

    @property
    def public_names(self) -> tuple[str, ...]:
        """Names of parameters with at least one public coordinate."""
        return self._names_where(False)

    def flatten(
        self, params: Mapping[str, torch.Tensor], *, batch_dims: int = 0
    ) -> torch.Tensor:
        """Concatenate ``params`` into the flat vector (``[*batch, D]``).

        Parameters
        ----------
        params : mapping of str to torch.Tensor
            One tensor per name of the split, each of shape ``[*batch, *shape]``.
        batch_dims : int
            Number of leading batch dimensions (1 for stacked client params).

        Returns
        -------
        torch.Tensor
            The flat vector(s).

        Raises
        ------
        dpfl.errors.InvalidParameterError
            If a name is missing or a shape disagrees with the split.
        """
        batch_dims = check_count("batch_dims", batch_dims)
        pieces = []
        batch_shape = None
        for name, shape in zip(self.names, self.shapes):
            if name not in params:
                raise InvalidParameterError(f"params lacks parameter {name!r}")
            t = params[name]
            if tuple(t.shape[batch_dims:]) != tuple(shape):
                raise InvalidParameterError(
                    f"parameter {name!r} must have shape [*batch, {tuple(shape)}] "
                    f"with {batch_dims} batch dims; got {tuple(t.shape)}"
                )
            batch_shape = t.shape[:batch_dims]
            pieces.append(t.reshape(*batch_shape, -1))
        return torch.cat(pieces, dim=-1)

    def unflatten(self, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split a flat vector ``[*batch, D]`` back into named parameters.

        Parameters
        ----------
        vector : torch.Tensor
            Flat vector(s), last dimension of length ``num_parameters``.

        Returns
        -------
        dict of str to torch.Tensor
            Views of ``vector`` of shape ``[*batch, *shape]``.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            If the last dimension has the wrong length.
        """
        self._check_vector("vector", vector, self.num_parameters)
        batch = vector.shape[:-1]
        out: dict[str, torch.Tensor] = {}
        start = 0
        for name, shape in zip(self.names, self.shapes):
            n = math.prod(shape)
            out[name] = vector[..., start : start + n].reshape(*batch, *shape)
            start += n
        return out

    def public(self, vector: torch.Tensor) -> torch.Tensor:
        """Return the public coordinates of a flat vector (``[*batch, d_pub]``)."""
        self._check_vector("vector", vector, self.num_parameters)
        return vector[..., self.public_index.to(vector.device)]

    def private(self, vector: torch.Tensor) -> torch.Tensor:
        """Return the private coordinates of a flat vector."""
        self._check_vector("vector", vector, self.num_parameters)
        return vector[..., self.private_index.to(vector.device)]

    def merge(self, public: torch.Tensor, private: torch.Tensor) -> torch.Tensor:
        """Rebuild the flat vector from its public and private parts.

        Parameters
        ----------
        public : torch.Tensor
            ``[*batch, num_public]``.
        private : torch.Tensor
            ``[*batch, num_private]``; broadcast against ``public``'s batch.

        Returns
        -------
        torch.Tensor
            ``[*batch, num_parameters]``, with ``public(merge(u, v)) == u``.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            If a part has the wrong length.
        """
        self._check_vector("public", public, self.num_public)
        self._check_vector("private", private, self.num_private)
        batch = torch.broadcast_shapes(public.shape[:-1], private.shape[:-1])
        out = public.new_empty(*batch, self.num_parameters)
        out[..., self.public_index.to(out.device)] = public
        out[..., self.private_index.to(out.device)] = private
        return out

    @staticmethod
    def _check_vector(name: str, vector: torch.Tensor, length: int) -> None:
        if vector.dim() < 1 or vector.shape[-1] != length:
            raise InvalidParameterError(
                f"{name} must have last dimension {length}; "
                f"got shape {tuple(vector.shape)}"
            )


def split_parameters(
    model: nn.Module | Mapping[str, torch.Tensor],
    *,
    private_fraction: float | None = None,
    predicate: Callable[[str, torch.Tensor], bool] | None = None,
) -> ParameterSplit:
    """Split a model's flat parameter vector into private and public parts.

    Give at most one of ``private_fraction`` and ``predicate``; with neither,
    the first half of the coordinates is private (MS-PAFL's experiment).

    Parameters
    ----------
    model : torch.nn.Module or mapping of str to torch.Tensor
        The model (its ``named_parameters``) or a functional parameter dict.
    private_fraction : float, optional
        Fraction in [0, 1]: the first ``floor(private_fraction * D)``
        coordinates of the flat vector are private, the rest public.
    predicate : callable, optional
        ``predicate(name, tensor) -> bool``; whole tensors for which it is
        true are private (e.g. keep the feature extractor on the device).

    Returns
    -------
    ParameterSplit
        The split, with ``public_names`` / ``private_names``, index masks and
        ``flatten`` / ``unflatten`` helpers.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If both options are given, the fraction is outside [0, 1], or the model
        has no parameters.

    References
    ----------
    Li, Wang, Tian, Wang & Su, "MS-PAFL", arXiv 2509.25906, §III-B1 and §V-A.
    """
    if private_fraction is not None and predicate is not None:
        raise InvalidParameterError(
            "give private_fraction or predicate, not both; got "
            f"private_fraction={private_fraction!r} and a predicate"
        )
    named = (
        list(model.named_parameters())
        if isinstance(model, nn.Module)
        else list(model.items())
    )
    if not named:
        raise InvalidParameterError("model has no parameters to split")
    names = tuple(n for n, _ in named)
    shapes = tuple(torch.Size(t.shape) for _, t in named)
    total = sum(t.numel() for _, t in named)
    if predicate is not None:
        mask = torch.cat(
            [
                torch.full((t.numel(),), bool(predicate(n, t)), dtype=torch.bool)
                for n, t in named
            ]
        )
    else:
        fraction = 0.5 if private_fraction is None else private_fraction
        fraction = check_probability("private_fraction", fraction, allow_zero=True)
        mask = torch.zeros(total, dtype=torch.bool)
        mask[: math.floor(fraction * total)] = True
    return ParameterSplit(names=names, shapes=shapes, private_mask=mask)
