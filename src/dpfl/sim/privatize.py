"""Where the Gaussian noise of a round is added, and by whom.

Three placements of the noise of a sum of clipped contributions (``C`` is the
clipping norm, ``σ`` the noise multiplier, ``m`` the participants, ``N`` the
available clients):

:class:`CentralGaussian`
    A trusted server adds one ``N(0, σ²C² I)`` to the aggregate
    (random-participation Algorithm 1, DP-FedAvg).
:class:`ClientGaussian`
    Each participant adds its own ``N(0, σ_c²C² I)`` before sending (LOCKS,
    MS-PAFL); the sum carries ``N(0, m σ_c²C² I)``.
:class:`NoiseOnlyMessages`
    Untrusted-server variant of random participation (§5.5): *every* available
    client sends a message each round, a participant its clipped sum plus its
    own noise, a non-participant noise only, so message arrival does not reveal
    who took part.

All three are simulated *without materialising per-client noise* when only
the sum is used: a sum of ``n`` independent ``N(0, s² I)`` vectors is
distributed exactly as one ``N(0, n s² I)`` vector (Gaussians are closed
under independent sums), so one draw of the total replaces ``n`` draws.
:meth:`ClientGaussian.noise_messages` draws per-client noise for algorithms
that need the individual messages.

A round that owns its gradient sum adds the noise in place, with the final
scaling, by :meth:`Privatizer.add_noise_`; :meth:`Privatizer.start_noise`
starts the same draw before the sum exists (on a worker thread, on CPU), so
that drawing ≈ 10⁵ normals overlaps the gradient computation. The draws from
a given generator state are the same either way.

Randomness comes from an explicit generator (:mod:`dpfl.sim.randomness`):
by default a :class:`~dpfl.sim.secure_noise.SecureGenerator` (a secret,
cryptographically secure stream with a floating-point-safe Gaussian
sampler), or, for a run that asks for reproducible noise, a seeded
:class:`torch.Generator` (not secure: anyone with the seed can draw the same
noise).

**One door.** Every Gaussian draw goes through
:func:`dpfl.sim.noise.gaussian_noise_` (:mod:`dpfl.sim.noise`): the
privatizers here and the background draws of :class:`PendingNoise` too.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from dpfl._validate import check_count, check_nonnegative, check_positive
from dpfl.errors import InvalidParameterError
from dpfl.sim._flat import flat_view
from dpfl.sim.noise import (
    _check_generator,
    _noise_buffers,
    _noise_views,
    _standard_normal_like,
    gaussian_noise_,
)
from dpfl.sim.secure_noise import (
    NoiseGenerator,
    SecureGenerator,
)

__all__ = [
    "CentralGaussian",
    "ClientGaussian",
    "NoiseOnlyMessages",
    "PendingNoise",
    "Privatizer",
]

Params = dict[str, torch.Tensor]


class Privatizer:
    """Adds a round's noise to the sum of the participants' clipped contributions.

    A privatizer says how much Gaussian noise the sum carries
    (:meth:`noise_std`); :meth:`add_noise` is the same for all of them: the
    sum of independent Gaussian messages is one Gaussian, drawn at once.
    """

    def noise_std(self, *, num_participants: int, num_available: int) -> float:
        """Standard deviation of the total noise on the sum, per coordinate."""
        raise NotImplementedError

    def add_noise(
        self,
        total: Mapping[str, torch.Tensor],
        *,
        num_participants: int,
        num_available: int,
        generator: NoiseGenerator,
    ) -> Params:
        """Return ``total`` plus the round's noise (``total`` is not modified).

        Parameters
        ----------
        total : mapping of str to torch.Tensor
            Sum of the participants' clipped contributions.
        num_participants : int
            Participants m this round (<= N).
        num_available : int
            Available clients N.
        generator : torch.Generator or SecureGenerator
            Source of the noise.

        Returns
        -------
        dict of str to torch.Tensor
            The noisy sum, as the server obtains it.
        """
        std = self.noise_std(
            num_participants=num_participants, num_available=num_available
        )
        return _add(total, std, generator)

    def add_noise_(
        self,
        total: dict[str, torch.Tensor],
        *,
        num_participants: int,
        num_available: int,
        generator: NoiseGenerator,
        scale: float = 1.0,
    ) -> Params:
        """In place: ``total ← scale · (total + noise)``, noise as in :meth:`add_noise`.

        For a caller that owns ``total`` (a fresh gradient sum): no copy of the
        model-sized sum is made, and a final scaling (e.g. the ``1/(pqn)`` of
        an unbiased estimate) comes for free. The noise is the same draw from
        ``generator`` as in :meth:`add_noise` (``N(0, std²)`` per coordinate,
        :meth:`noise_std`), drawn already scaled, ``N(0, (scale·std)²)``;
        results agree with ``scale * add_noise(...)`` up to floating-point
        rounding. When the tensors of ``total`` tile one flat buffer (as
        returned by :func:`dpfl.sim.grad.clipped_grad_sum`), the noise is
        added in one operation.

        Parameters
        ----------
        total : dict of str to torch.Tensor
            Sum of the participants' clipped contributions; modified.
        num_participants : int
            Participants m this round (<= N).
        num_available : int
            Available clients N.
        generator : torch.Generator or SecureGenerator
            Source of the noise.
        scale : float
            Factor applied to the noisy sum (> 0; default 1).

        Returns
        -------
        dict of str to torch.Tensor
            ``total``, now the scaled noisy sum.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            On bad counts, parameters, ``scale`` or ``generator``.
        """
        return self.start_noise(
            total,
            num_participants=num_participants,
            num_available=num_available,
            generator=generator,
            scale=scale,
            background=False,
        ).add_to_(total)

    def start_noise(
        self,
        like: Mapping[str, torch.Tensor],
        *,
        num_participants: int,
        num_available: int,
        generator: NoiseGenerator,
        scale: float = 1.0,
        background: bool = True,
    ) -> PendingNoise:
        """Start drawing the noise of :meth:`add_noise_` before the sum exists.

        The noise does not depend on the sum, so a round can draw it while it
        computes the gradients: with ``background``, a CPU generator and more
        than one intra-op thread (``torch.get_num_threads()``), the draw runs
        on a worker thread (a CPU generator draws on one core; the gradient
        pass leaves the other idle much of the time), and
        :meth:`PendingNoise.add_to_` waits for it. The draws are those that
        :meth:`add_noise_` would make from the same generator state, so the
        result does not depend on the timing. ``generator`` must not be used
        by anything else until :meth:`PendingNoise.add_to_` or
        :meth:`PendingNoise.wait` returns.

        Parameters
        ----------
        like : mapping of str to torch.Tensor
            Templates of the sum (names, shapes, dtypes, devices); their
            values are not read.
        num_participants : int
            Participants m this round (<= N).
        num_available : int
            Available clients N.
        generator : torch.Generator or SecureGenerator
            Source of the noise.
        scale : float
            Factor applied to the noisy sum (> 0; default 1).
        background : bool
            Draw on a worker thread when that can help (see above).

        Returns
        -------
        PendingNoise
            The draw, to add with :meth:`PendingNoise.add_to_`.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            On bad counts, parameters, ``scale`` or ``generator``.
        """
        std = self.noise_std(
            num_participants=num_participants, num_available=num_available
        )
        return PendingNoise(
            like,
            std,
            generator,
            check_positive("scale", scale),
            background=background,
        )


class PendingNoise:
    """Gaussian noise for one model-shaped sum, drawn now or on a worker thread.

    Made by :meth:`Privatizer.start_noise`: it holds ``N(0, (scale·std)²)``
    noise shaped like the templates, and :meth:`add_to_` turns a sum into
    ``scale · sum + noise`` in place.
    """

    def __init__(
        self,
        like: Mapping[str, torch.Tensor],
        std: float,
        generator: NoiseGenerator,
        scale: float,
        *,
        background: bool,
    ) -> None:
        _check_generator(generator)
        self.scale = scale
        self._shapes = {name: tuple(t.shape) for name, t in like.items()}
        self._noise: list[torch.Tensor] | None = None
        self._future: Future[list[torch.Tensor]] | None = None
        self._added = False
        if std == 0.0:
            return
        # Buffers are allocated here, in the caller's thread (memory from a
        # worker thread's malloc arena is returned to the system when freed
        # and faults back in page by page every round); the worker only fills.
        self._devices = {name: t.device for name, t in like.items()}
        buffers = _noise_buffers(like, generator.device)
        std = scale * std

        if isinstance(generator, SecureGenerator):
            # the draw indices are taken now, in the caller's order
            indices = [generator.reserve() for _ in buffers]

            def draw() -> list[torch.Tensor]:
                for buf, index in zip(buffers, indices):
                    gaussian_noise_(buf, generator, std, draw=index)
                return buffers

        else:

            def draw() -> list[torch.Tensor]:
                for buf in buffers:
                    gaussian_noise_(buf, generator, std)
                return buffers

        if (
            background
            and generator.device.type == "cpu"
            and torch.get_num_threads() > 1
        ):
            self._future = _noise_executor().submit(draw)
        else:
            self._noise = draw()

    def wait(self) -> None:
        """Block until the draw is done (re-raising its error, if any)."""
        if self._future is not None:
            self._noise = self._future.result()
            self._future = None

    def add_to_(self, total: dict[str, torch.Tensor]) -> Params:
        """Wait for the noise and set ``total ← scale · total + noise`` in place.

        Parameters
        ----------
        total : dict of str to torch.Tensor
            The sum, with the names and shapes of the templates; modified.

        Returns
        -------
        dict of str to torch.Tensor
            ``total``.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            If ``total`` does not match the templates.
        """
        self.wait()
        if self._added:
            raise InvalidParameterError("this noise was already added to a sum")
        shapes = {name: tuple(t.shape) for name, t in total.items()}
        if shapes != self._shapes:
            raise InvalidParameterError(
                "total does not match the tensors the noise was drawn for: "
                f"{sorted(shapes)[:5]} vs {sorted(self._shapes)[:5]}"
            )
        self._added = True
        if self._noise is None:  # std = 0: no noise
            if self.scale != 1.0:
                for v in total.values():
                    v.mul_(self.scale)
            return total
        flat = flat_view(list(total.values()))
        if (
            len(self._noise) == 1
            and flat is not None
            and self._noise[0].device == flat.device
            and self._noise[0].dtype == flat.dtype
            and list(self._shapes) == list(total)
        ):
            torch.add(self._noise[0], flat, alpha=self.scale, out=flat)
            return total
        noise = _noise_views(self._noise, self._shapes, self._devices)
        for name, v in total.items():
            torch.add(noise[name], v, alpha=self.scale, out=v)
        return total


_EXECUTOR: tuple[int, ThreadPoolExecutor] | None = None


def _noise_executor() -> ThreadPoolExecutor:
    """The worker thread of background noise draws (one per process).

    Made on first use; a forked child inherits the executor object but not its
    thread, so a new one is made there. (Two threads racing here at most make
    one executor too many, which starts no thread until used.)
    """
    global _EXECUTOR
    if _EXECUTOR is None or _EXECUTOR[0] != os.getpid():
        _EXECUTOR = (
            os.getpid(),
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpfl-noise"),
        )
    return _EXECUTOR[1]


def _add(
    total: Mapping[str, torch.Tensor], std: float, generator: NoiseGenerator
) -> Params:
    std = check_nonnegative("std", std)
    _check_generator(generator)
    if std == 0.0:
        return {k: v.clone() for k, v in total.items()}
    noise = _standard_normal_like(total, generator)
    return {k: torch.add(v, noise[k], alpha=std) for k, v in total.items()}


def _counts(num_participants: int, num_available: int) -> tuple[int, int]:
    m = check_count("num_participants", num_participants, minimum=0)
    n = check_count("num_available", num_available, minimum=1)
    if m > n:
        raise InvalidParameterError(
            f"num_participants must be <= num_available ({n}); got {m}"
        )
    return m, n


class _ScaledGaussian(Privatizer):
    """A privatizer whose noise is σ·C-scaled Gaussian: σ and C are checked once.

    Every draw then reads them as they are (nothing is re-validated per round).

    Parameters
    ----------
    noise_multiplier : float
        σ > 0, in units of ``clip``.
    clip : float
        Clipping norm C > 0.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If σ or C is not positive and finite.
    """

    def __init__(self, *, noise_multiplier: float, clip: float) -> None:
        self.noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
        self.clip = check_positive("clip", clip)


class CentralGaussian(_ScaledGaussian):
    """A trusted server adds ``N(0, (noise_multiplier · clip)² I)`` to the sum.

    Parameters
    ----------
    noise_multiplier : float
        σ, the noise std in units of ``clip`` (> 0).
    clip : float
        Clipping norm C (> 0): each contribution's L2 sensitivity.

    References
    ----------
    Hasircioglu & Gündüz, arXiv 2205.01556, eq. (4) and Algorithm 1.
    """

    def noise_std(self, *, num_participants: int, num_available: int) -> float:
        """Return ``noise_multiplier · clip``, whoever took part.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            On bad counts.
        """
        _counts(num_participants, num_available)
        return self.noise_multiplier * self.clip


class ClientGaussian(_ScaledGaussian):
    """Each participant adds its own ``N(0, (noise_multiplier · clip)² I)``.

    The sum of the ``m`` participants' messages carries noise of std
    ``sqrt(m) · σ_c · C``; :meth:`add_noise` draws that total at once,
    :meth:`noise_messages` draws per-client noise.

    Parameters
    ----------
    noise_multiplier : float
        σ_c, each client's noise std in units of ``clip`` (> 0).
    clip : float
        Clipping norm C (> 0).
    """

    def message_std(self) -> float:
        """Return one client's noise std ``σ_c · C``."""
        return self.noise_multiplier * self.clip

    def noise_std(self, *, num_participants: int, num_available: int) -> float:
        """Return ``sqrt(num_participants) · σ_c · C``."""
        m, _ = _counts(num_participants, num_available)
        return math.sqrt(m) * self.message_std()

    def noise_messages(
        self, stacked: Mapping[str, torch.Tensor], generator: NoiseGenerator
    ) -> Params:
        """Add independent per-client noise to ``[num_clients, ...]`` messages.

        Parameters
        ----------
        stacked : mapping of str to torch.Tensor
            Each client's clipped contribution, client along dimension 0.
        generator : torch.Generator or SecureGenerator
            Source of the noise.

        Returns
        -------
        dict of str to torch.Tensor
            The noisy messages.
        """
        return _add(stacked, self.message_std(), generator)


class NoiseOnlyMessages(_ScaledGaussian):
    """Untrusted server (random participation §5.5): every client sends a message.

    Participants send their clipped sum plus their own noise, the others noise.

    The server receives ``N`` messages, so it cannot tell who took part. Their
    sum is the participants' clipped sum plus the sum of ``N`` independent
    ``N(0, s² I)`` noises, which is one ``N(0, N s² I)``: it is drawn at once,
    and ``N`` messages are never materialised.

    Two choices of the per-message std ``s``:

    ``secure_aggregation=True``
        ``s = σC / sqrt(N)``, so the total noise on the sum is exactly the
        calibrated ``σC`` and the round is distributed like the trusted-server
        round. The guarantee then holds against a server that sees **only the
        sum** of the messages (secure aggregation); one message alone carries
        only ``σC/sqrt(N)`` of noise.
    ``secure_aggregation=False`` (default: the paper's §5.5 reading, docs/analyses.md)
        ``s = σC``: each message alone is the calibrated Gaussian mechanism
        of its client, so the guarantee holds against a server that reads each
        message; the noise on the sum is ``sqrt(N)`` times larger (the paper's
        "higher variance of the effective noise").

    In both cases the round realises the same accounting event as the
    trusted-server round (the other clients' messages are given to the
    adversary for free in the sound analysis, docs/analyses.md).

    Parameters
    ----------
    noise_multiplier : float
        σ: the calibrated noise on the sum (secure aggregation) or on each
        message, in units of ``clip`` (> 0).
    clip : float
        Clipping norm C (> 0).
    secure_aggregation : bool
        See above.

    References
    ----------
    Hasircioglu & Gündüz, arXiv 2205.01556, §5.5.
    """

    def __init__(
        self, *, noise_multiplier: float, clip: float, secure_aggregation: bool = False
    ) -> None:
        super().__init__(noise_multiplier=noise_multiplier, clip=clip)
        self.secure_aggregation = secure_aggregation

    def message_std(self, *, num_available: int) -> float:
        """Return the noise std ``s`` of one message.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            On a bad count.
        """
        n = check_count("num_available", num_available, minimum=1)
        base = self.noise_multiplier * self.clip
        return base / math.sqrt(n) if self.secure_aggregation else base

    def noise_std(self, *, num_participants: int, num_available: int) -> float:
        """Return the std of the total noise on the sum, ``sqrt(N) · s``.

        With secure aggregation this is ``σC`` exactly (not recomputed from
        ``s``, to avoid rounding).
        """
        _, n = _counts(num_participants, num_available)
        if self.secure_aggregation:
            return self.noise_multiplier * self.clip
        return math.sqrt(n) * self.message_std(num_available=n)
