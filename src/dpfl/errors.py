"""Errors raised by dpfl.

Every error a user can cause derives from :class:`DpflError` (itself a
``ValueError``), so a caller can catch them all at once, and the command line
turns them into a one-line message and exit status 2.
"""

from __future__ import annotations

__all__ = [
    "BudgetExceededError",
    "DpflError",
    "InvalidParameterError",
    "NonFiniteUpdateError",
    "UnsupportedEventError",
]


class DpflError(ValueError):
    """Base class of every error dpfl raises on bad input or state."""


class InvalidParameterError(DpflError):
    """A parameter is outside its domain; the message names it and its value."""


class UnsupportedEventError(DpflError):
    """An accountant was given an event (or analysis) it cannot price."""


class BudgetExceededError(DpflError):
    """The next round would spend more privacy than the budget allows."""


class NonFiniteUpdateError(DpflError):
    """A gradient or model update contains NaN or Inf and was not aggregated."""
