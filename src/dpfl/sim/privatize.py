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

Randomness comes from an explicit :class:`torch.Generator` (STYLE.md rule 7).
This is a simulator: ``torch``'s Philox/Mersenne generators are not
cryptographically secure, and a deployment must draw its noise from a secure
source (e.g. the OS CSPRNG) with a floating-point-safe sampler.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from dpfl.accounting._checks import check_count, check_nonnegative, check_positive
from dpfl.errors import InvalidParameterError

__all__ = [
    "CentralGaussian",
    "ClientGaussian",
    "NoiseOnlyMessages",
    "Privatizer",
    "gaussian_noise_like",
]

Params = dict[str, torch.Tensor]


def gaussian_noise_like(
    params: Mapping[str, torch.Tensor], std: float, generator: torch.Generator
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
    generator : torch.Generator
        Source of randomness.

    Returns
    -------
    dict of str to torch.Tensor
        Noise tensors, by name.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``std`` is negative or not finite, or ``generator`` is not a
        ``torch.Generator``.
    """
    std = check_nonnegative("std", std)
    _check_generator(generator)
    if std == 0.0:
        return {name: torch.zeros_like(t) for name, t in params.items()}
    out = _standard_normal_like(params, generator)
    for z in out.values():
        z.mul_(std)
    return out


def _check_generator(generator: object) -> None:
    if not isinstance(generator, torch.Generator):
        raise InvalidParameterError(
            f"generator must be a torch.Generator; got {type(generator).__name__}"
        )


def _standard_normal_like(
    params: Mapping[str, torch.Tensor], generator: torch.Generator
) -> Params:
    """``N(0, 1)`` tensors shaped like ``params``, in the mapping's order.

    When every template has the same floating dtype the noise is one flat draw
    (one call into the generator) split into views, else one draw per tensor.
    """
    dtypes = {
        t.dtype if t.is_floating_point() else torch.float32 for t in params.values()
    }
    if len(dtypes) == 1:
        dtype = dtypes.pop()
        flat = torch.randn(
            sum(t.numel() for t in params.values()),
            generator=generator,
            device=generator.device,
            dtype=dtype,
        )
        out: Params = {}
        offset = 0
        for name, t in params.items():
            n = t.numel()
            out[name] = flat[offset : offset + n].view(t.shape).to(device=t.device)
            offset += n
        return out
    out = {}
    for name, t in params.items():
        dtype = t.dtype if t.is_floating_point() else torch.float32
        z = torch.randn(
            t.shape, generator=generator, device=generator.device, dtype=dtype
        )
        out[name] = z.to(device=t.device)
    return out


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
        generator: torch.Generator,
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
        generator : torch.Generator
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


def _add(
    total: Mapping[str, torch.Tensor], std: float, generator: torch.Generator
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


class CentralGaussian(Privatizer):
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

    def __init__(self, *, noise_multiplier: float, clip: float) -> None:
        self.noise_multiplier = noise_multiplier
        self.clip = clip

    def noise_std(self, *, num_participants: int, num_available: int) -> float:
        """Return ``noise_multiplier · clip``, whoever took part.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            On bad parameters or counts.
        """
        _counts(num_participants, num_available)
        return check_positive(
            "noise_multiplier", self.noise_multiplier
        ) * check_positive("clip", self.clip)


class ClientGaussian(Privatizer):
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

    def __init__(self, *, noise_multiplier: float, clip: float) -> None:
        self.noise_multiplier = noise_multiplier
        self.clip = clip

    def message_std(self) -> float:
        """Return one client's noise std ``σ_c · C``."""
        return check_positive(
            "noise_multiplier", self.noise_multiplier
        ) * check_positive("clip", self.clip)

    def noise_std(self, *, num_participants: int, num_available: int) -> float:
        """Return ``sqrt(num_participants) · σ_c · C``."""
        m, _ = _counts(num_participants, num_available)
        return math.sqrt(m) * self.message_std()

    def noise_messages(
        self, stacked: Mapping[str, torch.Tensor], generator: torch.Generator
    ) -> Params:
        """Add independent per-client noise to ``[num_clients, ...]`` messages.

        Parameters
        ----------
        stacked : mapping of str to torch.Tensor
            Each client's clipped contribution, client along dimension 0.
        generator : torch.Generator
            Source of the noise.

        Returns
        -------
        dict of str to torch.Tensor
            The noisy messages.
        """
        return _add(stacked, self.message_std(), generator)


class NoiseOnlyMessages(Privatizer):
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
    ``secure_aggregation=False`` (default: the paper's §5.5 reading, SPEC §0.1)
        ``s = σC``: each message alone is the calibrated Gaussian mechanism
        of its client, so the guarantee holds against a server that reads each
        message; the noise on the sum is ``sqrt(N)`` times larger (the paper's
        "higher variance of the effective noise").

    In both cases the round realises the same accounting event as the
    trusted-server round (the other clients' messages are given to the
    adversary for free in the sound analysis, SPEC.md §0.3).

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
        self.noise_multiplier = noise_multiplier
        self.clip = clip
        self.secure_aggregation = secure_aggregation

    def message_std(self, *, num_available: int) -> float:
        """Return the noise std ``s`` of one message.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            On bad parameters.
        """
        n = check_count("num_available", num_available, minimum=1)
        base = check_positive(
            "noise_multiplier", self.noise_multiplier
        ) * check_positive("clip", self.clip)
        return base / math.sqrt(n) if self.secure_aggregation else base

    def noise_std(self, *, num_participants: int, num_available: int) -> float:
        """Return the std of the total noise on the sum, ``sqrt(N) · s``.

        With secure aggregation this is ``σC`` exactly (not recomputed from
        ``s``, to avoid rounding).
        """
        _, n = _counts(num_participants, num_available)
        if self.secure_aggregation:
            return check_positive("noise_multiplier", self.noise_multiplier) * (
                check_positive("clip", self.clip)
            )
        return math.sqrt(n) * self.message_std(num_available=n)
