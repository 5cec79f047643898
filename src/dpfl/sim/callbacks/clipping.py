"""A warning when most updates are clipped, round after round."""

from __future__ import annotations

import logging
from typing import Any

from dpfl._validate import check_count, check_probability
from dpfl.sim.callbacks.base import Callback, FitState

__all__ = ["ClippingWarning"]

log = logging.getLogger("dpfl.sim")


class ClippingWarning(Callback):
    """Warn once when most updates are clipped for several rounds in a row.

    Reads each round record's ``clipped_fraction`` (the share of clipped
    updates or records, which DP-DSGD, DP-FedAvg and MS-PAFL report). When
    it exceeds ``fraction`` in ``rounds`` consecutive rounds, one warning
    goes to the ``dpfl.sim`` logger: a clip bound that cuts nearly every
    update throws away the updates' scale (the noise, set by the clip, then
    weighs more against them), and a larger bound often trains better at the
    same privacy.

    Parameters
    ----------
    fraction : float or None
        The clipped share, in (0, 1], above which a round counts (default
        0.8); ``None`` turns the warning off.
    rounds : int
        Consecutive such rounds before the warning (default 5).

    Examples
    --------
    >>> ClippingWarning(fraction=0.9, rounds=10).rounds
    10
    """

    def __init__(self, fraction: float | None = 0.8, rounds: int = 5) -> None:
        self.fraction = (
            None if fraction is None else check_probability("fraction", fraction)
        )
        self.rounds = check_count("rounds", rounds, minimum=1)
        self._streak = 0
        self._warned = False

    def on_fit_begin(self, state: FitState) -> None:
        """Start counting afresh."""
        self._streak = 0
        self._warned = False

    def on_round_end(self, state: FitState, record: dict[str, Any]) -> None:
        """Count the round if most of it was clipped; warn at the streak's end."""
        share = record.get("clipped_fraction")
        if self.fraction is None or self._warned or share is None:
            return
        self._streak = self._streak + 1 if share > self.fraction else 0
        if self._streak < self.rounds:
            return
        self._warned = True
        clip = getattr(getattr(state.trainer.algorithm, "params", None), "clip", None)
        bound = (
            f"the clip bound ({clip:g})"
            if isinstance(clip, int | float)
            else ("the clip bound")
        )
        log.warning(
            "%s: more than %.0f%% of updates were clipped in each of the last %d "
            "rounds (%.0f%% in round %d): %s is probably small for these updates; "
            "a larger one (or adaptive clipping) usually trains better at the same "
            "privacy. Change this check with ClippingWarning(fraction=..., "
            "rounds=...) among the callbacks (fraction=None: off).",
            state.name or "training",
            100 * self.fraction,
            self.rounds,
            100 * share,
            record["round"],
            bound,
        )
