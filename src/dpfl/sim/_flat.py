"""Model-shaped tensors as views into one flat buffer.

Elementwise work over all of a model's parameters (noise, momentum, scaling)
is then one operation on the buffer instead of one per tensor, which matters
when a round is a few milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

__all__ = ["flat_view", "flat_zeros"]


def flat_zeros(
    p: Mapping[str, torch.Tensor], lead: tuple[int, ...] = (), *, zero: bool = True
) -> dict[str, torch.Tensor]:
    """Zeroed accumulators ``[*lead, *shape]`` for each tensor of ``p``.

    Without ``lead`` and when every tensor has the same dtype and device, they
    are views into one flat buffer, in the order of ``p``. With
    ``zero=False`` (and no ``lead``) they are left uninitialised, for a
    caller that writes each of them before reading it.
    """
    kinds = {(t.dtype, t.device) for t in p.values()}
    if lead or len(kinds) != 1:
        return {n: t.new_zeros(*lead, *t.shape) for n, t in p.items()}
    dtype, device = kinds.pop()
    numel = sum(t.numel() for t in p.values())
    make = torch.zeros if zero else torch.empty
    flat = make(numel, dtype=dtype, device=device)
    out: dict[str, torch.Tensor] = {}
    offset = 0
    for name, t in p.items():
        out[name] = flat[offset : offset + t.numel()].view(t.shape)
        offset += t.numel()
    return out


def flat_view(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """One 1-d view of ``tensors`` if they tile one contiguous buffer in order.

    True of tensors made by :func:`flat_zeros` (e.g. the sums of
    :func:`dpfl.sim.grad.clipped_grad_sum`); elementwise work on them is
    then one operation instead of one per tensor. ``None`` if they do not (or
    there are none, or their storage cannot be read: tensors of a backend
    without storage, such as torch's lazy tensors).
    """
    if not tensors:
        return None
    first = tensors[0]
    try:
        storage = first.untyped_storage().data_ptr()
    except RuntimeError:
        return None
    offset = first.storage_offset()
    for t in tensors:
        if (
            t.dtype != first.dtype
            or t.device != first.device
            or not t.is_contiguous()
            or t.storage_offset() != offset
            or t.untyped_storage().data_ptr() != storage
        ):
            return None
        offset += t.numel()
    return first.as_strided((offset - first.storage_offset(),), (1,))
