"""Every Gaussian draw of the simulation: the one door to the noise generators.

:func:`gaussian_noise_` fills a tensor in place with ``N(0, std²)`` from an
explicit generator, handing it to :func:`~dpfl.sim.secure_noise.fill_normal_`
(or, for one generator per row,
:func:`~dpfl.sim.secure_noise.fill_normal_rows_`):
by default a :class:`~dpfl.sim.secure_noise.SecureGenerator` (a secret,
cryptographically secure stream with a floating-point-safe Gaussian
sampler), or, for a run that asks for reproducible noise, a seeded
:class:`torch.Generator` (not secure: anyone with the seed can draw the same
noise). The privatizers of :mod:`dpfl.sim.privatize`,
:func:`gaussian_noise_like` and :func:`gaussian_noise_rows` (per-client noise
of local DP-SGD steps) and the noisy count of adaptive clipping
(:func:`noisy_count`) all draw through it. No algorithm draws noise any
other way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from dpfl._validate import check_nonnegative
from dpfl.errors import InvalidParameterError
from dpfl.sim.secure_noise import (
    NoiseGenerator,
    SecureGenerator,
    fill_normal_,
    fill_normal_rows_,
)

__all__ = [
    "gaussian_noise_",
    "gaussian_noise_like",
    "gaussian_noise_rows",
    "noisy_count",
]

Params = dict[str, torch.Tensor]


def gaussian_noise_(
    out: torch.Tensor,
    generator: NoiseGenerator | Sequence[NoiseGenerator],
    std: float = 1.0,
    *,
    draw: int | None = None,
) -> torch.Tensor:
    """Fill ``out`` with ``N(0, std²)`` noise, in place: the one door to noise.

    Parameters
    ----------
    out : torch.Tensor
        Floating tensor on the generator's device.
    generator : torch.Generator, SecureGenerator, or a sequence of them
        The source; a sequence gives one generator per row of a 2-D ``out``
        (row ``j`` from ``generator[j]``, as if drawn one after another).
    std : float
        Standard deviation (not re-validated: the callers check it).
    draw : int or None
        A :class:`~dpfl.sim.secure_noise.SecureGenerator`'s draw index taken
        earlier with ``reserve()`` (a draw made later or on another thread);
        ``None``: the generator's next draw.

    Returns
    -------
    torch.Tensor
        ``out``.
    """
    if isinstance(generator, torch.Generator | SecureGenerator):
        if draw is not None:
            if not isinstance(generator, SecureGenerator):
                raise InvalidParameterError(
                    "draw is for a SecureGenerator's reserved draw; got a "
                    f"{type(generator).__name__}"
                )
            return generator.normal_(out, std, draw=draw)
        return fill_normal_(out, generator, std)
    return fill_normal_rows_(out, generator, std)


def noisy_count(count: float, std: float, generator: NoiseGenerator) -> float:
    """``count + N(0, std²)``: a scalar count released with Gaussian noise.

    The count of adaptive clipping (Andrew et al. 2021, Algorithm 1: how many
    updates were under the bound) is drawn in float64 from one draw of
    ``generator`` on its device.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``std`` is negative or not finite, or ``generator`` is neither kind.
    """
    std = check_nonnegative("std", std)
    _check_generator(generator)
    z = torch.empty((), device=generator.device, dtype=torch.float64)
    return count + float(gaussian_noise_(z, generator)) * std


def gaussian_noise_like(
    params: Mapping[str, torch.Tensor], std: float, generator: NoiseGenerator
) -> dict[str, torch.Tensor]:
    """Independent ``N(0, std²)`` noise shaped like each tensor of ``params``.

    Tensors are filled in the mapping's order from ``generator``, so the same
    generator state gives the same noise. Noise is drawn on the generator's
    device and moved to each tensor's device and dtype if they differ.

    Parameters
    ----------
    params : mapping of str to torch.Tensor
        Templates (shape, dtype, device); their values are not read.
    std : float
        Standard deviation (>= 0; 0 gives zeros without touching the generator).
    generator : torch.Generator or SecureGenerator
        Source of randomness.

    Returns
    -------
    dict of str to torch.Tensor
        Noise tensors, by name.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``std`` is negative or not finite, or ``generator`` is not a
        ``torch.Generator`` or a ``SecureGenerator``.
    """
    std = check_nonnegative("std", std)
    _check_generator(generator)
    if std == 0.0:
        return {name: torch.zeros_like(t) for name, t in params.items()}
    out = _standard_normal_like(params, generator)
    for z in out.values():
        z.mul_(std)
    return out


def gaussian_noise_rows(
    like: torch.Tensor, std: float, generators: Sequence[NoiseGenerator]
) -> torch.Tensor:
    """``N(0, std²)`` rows shaped like ``[m, d]`` ``like``, from one generator each.

    Row ``j`` comes from ``generators[j]`` and equals
    ``gaussian_noise_like({"g": like[j]}, std, generators[j])["g"]`` bit for
    bit (one draw of each generator, in row order); the rows are drawn into
    one ``[m, d]`` tensor by :func:`~dpfl.sim.secure_noise.fill_normal_rows_`
    (one kernel launch for them all on CUDA with secure generators), on the
    generators' device, and returned on ``like``'s device and in its dtype
    (generators on different devices: row by row).

    Parameters
    ----------
    like : torch.Tensor
        ``[m, d]`` template (shape, dtype, device); its values are not read.
    std : float
        Standard deviation (>= 0; 0 gives zeros without touching the
        generators).
    generators : sequence of torch.Generator or SecureGenerator
        One per row (each client's own).

    Returns
    -------
    torch.Tensor
        ``[m, d]`` noise.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``std`` is negative or not finite, ``like`` is not 2-D, there is not
        one generator per row, or a generator is neither kind.
    """
    std = check_nonnegative("std", std)
    if like.dim() != 2 or like.shape[0] != len(generators):
        raise InvalidParameterError(
            f"like must be [m, d] with one generator per row; got shape "
            f"{tuple(like.shape)} and {len(generators)} generators"
        )
    for g in generators:
        _check_generator(g)
    if std == 0.0:
        return torch.zeros_like(like)
    devices = {str(g.device) for g in generators}
    if len(devices) > 1:
        return torch.stack(
            [
                gaussian_noise_like({"g": row}, std, g)["g"]
                for row, g in zip(like, generators, strict=True)
            ]
        )
    device = devices.pop() if devices else like.device
    dtype = like.dtype if like.is_floating_point() else torch.float32
    out = torch.empty(like.shape, dtype=dtype, device=device)
    gaussian_noise_(out, generators)
    return out.mul_(std).to(device=like.device)


def _check_generator(generator: object) -> None:
    if not isinstance(generator, torch.Generator | SecureGenerator):
        raise InvalidParameterError(
            "generator must be a torch.Generator or a SecureGenerator; got "
            f"{type(generator).__name__}"
        )


def _noise_buffers(
    like: Mapping[str, torch.Tensor], device: torch.device
) -> list[torch.Tensor]:
    """Uninitialised storage for noise shaped like ``like``, on ``device``.

    One flat buffer (one call into the generator) when every template has the
    same floating dtype, else one buffer per template (float32 for integer
    templates).
    """
    dtypes = [
        t.dtype if t.is_floating_point() else torch.float32 for t in like.values()
    ]
    if len(set(dtypes)) == 1:
        numel = sum(t.numel() for t in like.values())
        return [torch.empty(numel, device=device, dtype=dtypes[0])]
    return [
        torch.empty(t.shape, device=device, dtype=dtype)
        for t, dtype in zip(like.values(), dtypes)
    ]


def _noise_views(
    buffers: list[torch.Tensor],
    shapes: Mapping[str, tuple[int, ...]],
    devices: Mapping[str, torch.device],
) -> Params:
    """The buffers of :func:`_noise_buffers` as named tensors on their devices."""
    if len(buffers) == 1:  # one flat draw, in the templates' order
        parts = buffers[0].reshape(-1).split([math.prod(s) for s in shapes.values()])
    else:
        parts = tuple(buffers)
    return {
        name: z.view(shape).to(device=devices[name])
        for (name, shape), z in zip(shapes.items(), parts, strict=True)
    }


def _standard_normal_like(
    params: Mapping[str, torch.Tensor], generator: NoiseGenerator
) -> Params:
    """``N(0, 1)`` tensors shaped like ``params``, in the mapping's order.

    When every template has the same floating dtype the noise is one flat draw
    (one call into the generator) split into views, else one draw per tensor.
    """
    buffers = _noise_buffers(params, generator.device)
    for buf in buffers:
        gaussian_noise_(buf, generator)
    return _noise_views(
        buffers,
        {name: tuple(t.shape) for name, t in params.items()},
        {name: t.device for name, t in params.items()},
    )
