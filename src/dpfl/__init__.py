"""dpfl: differentially private federated learning with privacy amplification.

``import dpfl`` is light (no torch): :func:`make_private` and
:class:`PrivateTrainer` (:mod:`dpfl.api`) are imported on first use, and
:mod:`dpfl.accounting` never needs torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["PrivateTrainer", "__version__", "make_private"]

if TYPE_CHECKING:
    from dpfl.api import PrivateTrainer, make_private


def __getattr__(name: str) -> Any:
    """Import the training API (and torch) only when it is first used."""
    if name in ("make_private", "PrivateTrainer"):
        from dpfl import api

        return getattr(api, name)
    raise AttributeError(f"module 'dpfl' has no attribute {name!r}")
