"""Which clients are online in a round: the availability models of DP-DSGD.

:class:`ClientAvailability` draws the round's online clients from the
server's generator; it realises no accounting event of its own (the sampler
that draws participants among the online clients does:
:meth:`dpfl.sim.sampling.PoissonParticipationSampler.sample_available`).
"""

from __future__ import annotations

import numpy as np

from dpfl._validate import (
    check_count,
    check_probability,
)
from dpfl.errors import InvalidParameterError
from dpfl.sim.sampling import _check_rng, _choose, _poisson_subset

__all__ = ["AVAILABILITY_MODELS", "ClientAvailability"]


AVAILABILITY_MODELS = ("all", "bernoulli", "fixed")


class ClientAvailability:
    """Which clients are online in a round (random participation's N_t <= N).

    Hasircioglu & Gündüz (arXiv 2205.01556, §3) let ``N_t <= N`` clients be
    available in round ``t``, with ``N_t`` known to the server. Availability
    is drawn here from the caller's generator and never looks at the data,
    which is what keeps the per-round accounting event unchanged: a client
    that is offline releases nothing in that round, and an online one faces
    exactly the analysed round, so the worst-off client is one that is always
    online (its event is charged every round).

    Parameters
    ----------
    num_clients : int
        Population N (>= 1).
    model : {"all", "bernoulli", "fixed"}
        ``"all"``: every client, every round (``N_t = N``); ``"bernoulli"``:
        each client is online independently w.p. ``rate`` (``N_t ~
        Binomial(N, rate)``); ``"fixed"``: ``available_clients`` clients
        chosen uniformly without replacement (``N_t`` fixed).
    rate : float
        Bernoulli model: the probability a client is online, in (0, 1].
    available_clients : int or None
        Fixed model: ``N_t``, ``1 <= N_t <= N``.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On an unknown model or a parameter outside its range.
    """

    def __init__(
        self,
        *,
        num_clients: int,
        model: str = "all",
        rate: float = 1.0,
        available_clients: int | None = None,
    ) -> None:
        self.num_clients = check_count("num_clients", num_clients, minimum=1)
        if model not in AVAILABILITY_MODELS:
            raise InvalidParameterError(
                f"availability model must be one of {AVAILABILITY_MODELS}; "
                f"got {model!r}"
            )
        self.model = model
        self.rate = check_probability("availability rate", rate)
        #: N_t of the fixed model (None for the other models).
        self.available_clients: int | None = None
        if model == "fixed":
            if available_clients is None:
                raise InvalidParameterError(
                    "available_clients must be given for the 'fixed' availability "
                    "model; got None"
                )
            self.available_clients = check_count(
                "available_clients", available_clients, minimum=1
            )
            if self.available_clients > self.num_clients:
                raise InvalidParameterError(
                    f"available_clients must be <= num_clients ({self.num_clients}); "
                    f"got {available_clients!r}"
                )
        elif available_clients is not None:
            raise InvalidParameterError(
                "available_clients is only used by the 'fixed' availability model "
                f"(model is {model!r}); got {available_clients!r}"
            )

    @property
    def always_all(self) -> bool:
        """Whether every client is online in every round."""
        return self.model == "all" or (self.model == "bernoulli" and self.rate == 1.0)

    def draw(self, rng: np.random.Generator) -> np.ndarray:
        """The round's online clients, int64, distinct and ascending.

        Parameters
        ----------
        rng : numpy.random.Generator
            Source of the draw (not advanced when every client is online).

        Returns
        -------
        numpy.ndarray
            The ``N_t`` available clients (possibly none, Bernoulli model).
        """
        rng = _check_rng(rng)
        if self.always_all:
            return np.arange(self.num_clients, dtype=np.int64)
        if self.model == "fixed":
            return _choose(rng, self.num_clients, int(self.available_clients or 0))
        return _poisson_subset(rng, self.num_clients, self.rate)
