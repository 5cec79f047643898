"""Settings of the process itself, made before torch loads.

The command line calls :func:`openmp_defaults` on its own environment before
anything imports torch, and ``benchmarks/engine.py`` and
``benchmarks/ray_scaling.py`` on the environments of the processes they time,
so that every timed process runs with the settings a ``dpfl`` command has.
"""

from __future__ import annotations

from collections.abc import MutableMapping

__all__ = ["GOMP_SPINCOUNT", "openmp_defaults"]

#: Rounds an idle OpenMP worker spins before it sleeps (GNU libgomp, the
#: OpenMP of torch's Linux wheels), for the training commands. libgomp's
#: default, 300,000, keeps each worker busy for milliseconds after every
#: parallel region, so the thread that draws a round's noise while the
#: gradients are computed shares a core with a spinner. With 10,000 the
#: non-private round is as fast as with the default and the DP round hides
#: its noise draw (paper scenario 1, 2 cores: DP/non-private 1.26 vs 1.31 in
#: random order, 1.31-1.34 vs 1.39-1.41 in fixed order; notes/engine.md).
GOMP_SPINCOUNT = "10000"


def openmp_defaults(env: MutableMapping[str, str], spin: str = GOMP_SPINCOUNT) -> None:
    """Set ``GOMP_SPINCOUNT`` in ``env`` unless it names a wait policy or spin.

    Only acts on a process that loads torch (and so libgomp) afterwards: the
    command line does so lazily, and ``benchmarks/engine.py`` for its timed
    subprocesses.

    Parameters
    ----------
    env : mutable mapping of str to str
        An environment (``os.environ`` or a child's copy); modified.
    spin : str
        The spin count to set.
    """
    if "OMP_WAIT_POLICY" not in env:
        env.setdefault("GOMP_SPINCOUNT", spin)
