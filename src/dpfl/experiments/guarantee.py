"""What a run's privacy amounts to: ``guarantee.json``.

:func:`guarantee_report` reads a run's released ledger: ε of the worst-off
privacy unit at the budget's δ under the run's analysis (with every term,
and the proven ε beside an unproven one), the figure of every other analysis
the scheme offers with its status and adversary, and the paper's own figures
where the algorithm states them. :class:`GuaranteeFile` is the callback that
writes it into the run folder when the round loop ends.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from dpfl._files import atomic_write
from dpfl.accounting import events as ev
from dpfl.accounting import schemes
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.errors import DpflError
from dpfl.experiments import rundir
from dpfl.experiments.config import RunConfig
from dpfl.sim.callbacks import Callback, FitState

if TYPE_CHECKING:
    from dpfl.sim.algorithms.base import DataStats

__all__ = ["GuaranteeFile", "guarantee_report"]


def guarantee_report(
    ledger: PrivacyLedger,
    event: ev.Event | None,
    delta: float,
    config: RunConfig,
    stats: DataStats,
) -> dict[str, Any]:
    """What the run's privacy amounts to: ``guarantee.json``.

    The ledger's summary (worst-off unit's ε under the run's analysis, with
    every term, and the proven ε beside an unproven one), the figure of
    every other analysis the scheme offers, each with its status and
    adversary (e.g. LOCKS: the server and the model observer), and under
    ``"paper"`` the paper's own figures with their caveats, where the
    algorithm states them.
    """
    if event is None:
        return {
            "private": False,
            "note": "no noise was added: the run has no privacy guarantee",
        }
    out: dict[str, Any] = {"private": True, **ledger.summary(delta)}
    from dpfl.sim.keys import noise_label

    out["noise"] = noise_label(config.privacy.secure_noise)
    if not ledger.rounds:
        return out
    from dpfl.sim.algorithms import algorithm_class

    cls = algorithm_class(config.algorithm.name)
    # Analyses that do not describe the mechanism run (e.g. participation made
    # visible to the server) are left out rather than reported beside it.
    valid = cls.valid_analyses(config.algorithm.params)
    scheme = schemes.scheme_of(event)
    analyses: dict[str, Any] = {}
    for a in scheme.analyses:
        if valid is not None and a.name not in valid:
            continue
        try:
            bound = ledger.epsilon(delta, analysis=a.name)
        except DpflError:  # an analysis the accountant cannot price (RDP)
            continue
        analyses[a.name] = {
            "epsilon": bound.upper,
            "status": a.status,
            "neighbouring": a.neighbouring or scheme.neighbouring,
            "adversary": a.adversary or scheme.adversary,
        }
    out["analyses"] = analyses
    try:
        paper = cls.paper_report(
            config.algorithm.params,
            stats,
            float(config.privacy.noise_multiplier or 0.0),
            ledger,
            delta,
        )
    except DpflError as exc:
        paper = {"error": str(exc)}
    if paper is not None:
        out["paper"] = json.loads(json.dumps(paper, default=_json_default))
    return out


def _json_default(value: Any) -> Any:
    """JSON for the values reports hold (dataclasses, arrays, bounds)."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


class GuaranteeFile(Callback):
    """Write ``guarantee.json`` when the loop ends (not after an error).

    Parameters
    ----------
    config : RunConfig
        The run, resolved; the file goes to the fit's run folder (or the
        configuration's).

    Attributes
    ----------
    guarantee : dict
        What was written (empty until the loop ends).
    """

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.guarantee: dict[str, Any] = {}

    def on_fit_end(self, state: FitState) -> None:
        """Write the file from the trainer's released ledger."""
        if state.error is not None:
            return
        trainer = state.trainer
        self.guarantee = guarantee_report(
            trainer.ledger.released_ledger(),
            trainer.algorithm.event(),
            self.config.privacy.delta,
            self.config,
            trainer.algorithm.stats,
        )
        text = json.dumps(self.guarantee, indent=1, default=str)
        path = state.run_dir or self.config.run_dir
        atomic_write(path / rundir.GUARANTEE, lambda fh: fh.write(text), binary=False)
