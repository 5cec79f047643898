"""Loss PMFs as the tilted composition takes them, and their moment bounds.

A :class:`Dist` is one round's finite loss PMF on a grid; a :class:`Mix` is a
round that releases ``k_j`` steps of ``Dist`` ``j`` with probability ``w_j``
and nothing otherwise. Both bound their cumulant generating functions from
above (exactly for at most 2048 non-zero masses, on at most that many bins
otherwise), which every Chernoff bound of :mod:`dpfl.accounting.tilted`
uses.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import numpy as np
from dp_accounting.pld import pld_pmf

from dpfl.accounting.envelope import UNIT_ROUNDOFF

__all__ = ["Dist", "dist_of"]


#: At most this many bins bound a PMF's moment generating function.
_MGF_BINS = 2048


def _lse_rows(a: np.ndarray, *, overwrite: bool = False) -> np.ndarray:
    """Row-wise log-sum-exp with -inf for all -inf rows (numpy only).

    ``overwrite``: ``a`` may be used as the work buffer (same arithmetic).
    """
    mx = np.max(a, axis=1)
    safe = np.where(np.isfinite(mx), mx, 0.0)
    with np.errstate(divide="ignore", under="ignore", invalid="ignore"):
        if overwrite:
            a -= safe[:, None]
            s = np.sum(np.exp(a, out=a), axis=1)
        else:
            s = np.sum(np.exp(a - safe[:, None]), axis=1)
        out = np.log(s) + safe
    return np.where(np.isfinite(mx), out, -np.inf)


class Dist:
    """The finite part of one PMF, ready for composition.

    Holds the trimmed, non-negative masses, their grid and a binned summary
    from which :meth:`log_mgf` bounds the moment generating function from
    above.

    Parameters
    ----------
    pmf : dp_accounting.pld.pld_pmf.PLDPmf
        A PMF (dense or sparse). Negative entries are read as 0.
    """

    def __init__(self, pmf: pld_pmf.PLDPmf) -> None:
        # pylint: disable=protected-access
        dense = pmf.to_dense_pmf()
        self.step = float(dense._discretization)
        self.pessimistic = bool(dense._pessimistic_estimate)
        self.infinity_mass = float(dense._infinity_mass)
        probs = np.asarray(dense._probs, dtype=float)
        probs = np.where(probs > 0.0, probs, 0.0)
        nz = np.flatnonzero(probs)
        offset = int(dense._lower_loss)
        if nz.size == 0:
            probs = np.zeros(1)
            nz = np.zeros(0, dtype=np.int64)
        else:
            offset += int(nz[0])
            probs = probs[nz[0] : nz[-1] + 1]
            nz = nz - nz[0]
        self.offset = offset
        self.probs = probs
        n = probs.size
        #: Upper bound on the finite mass.
        self.mass = float(np.sum(probs)) * (1.0 + (n + 1) * UNIT_ROUNDOFF)
        loss = (offset + nz) * self.step
        mass_nz = probs[nz]
        if nz.size > _MGF_BINS:
            starts = np.unique(np.linspace(0, nz.size, _MGF_BINS + 1).astype(np.int64))
            starts = starts[:-1]
            ends = np.append(starts[1:], nz.size) - 1
            bin_mass = np.add.reduceat(mass_nz, starts)
            centre = np.add.reduceat(mass_nz * loss, starts) / bin_mass
            dev = loss - np.repeat(centre, np.diff(np.append(starts, nz.size)))
            first = np.add.reduceat(mass_nz * dev, starts)
            second = np.add.reduceat(mass_nz * dev * dev, starts)
            lo, hi = loss[starts], loss[ends]
        else:
            bin_mass, centre, lo, hi = mass_nz, loss, loss, loss  # type: ignore[assignment]
            first = second = np.zeros(loss.size)
        with np.errstate(divide="ignore"):
            # + a relative margin for the rounding of the bin sums
            self._log_mass = np.log(bin_mass) + 4.0 * (n + 1) * UNIT_ROUNDOFF
        self._lo, self._hi, self._centre = lo, hi, centre
        self._mass = bin_mass * (1.0 + 4.0 * (n + 1) * UNIT_ROUNDOFF)
        self._first = np.abs(first) + 4.0 * (n + 1) * UNIT_ROUNDOFF * bin_mass * (
            hi - lo
        )
        self._second = second * (1.0 + 4.0 * (n + 1) * UNIT_ROUNDOFF)
        self._width = hi - lo

    @property
    def size(self) -> int:
        """Number of grid points from the first to the last non-zero mass."""
        return int(self.probs.size)

    @property
    def min_loss(self) -> float:
        """Smallest loss carrying mass."""
        return self.offset * self.step

    @property
    def max_loss(self) -> float:
        """Largest loss carrying mass."""
        return (self.offset + self.size - 1) * self.step

    def log_mgf(self, t: np.ndarray) -> np.ndarray:
        """Upper bound on ``log sum_l p_l e^{t l}`` for each ``t`` (vectorised).

        Exact (to rounding) when the PMF has at most 2048 non-zero masses.
        Otherwise each bin of consecutive masses, of mass ``m``, centre ``c``
        (its mean loss), first and second central moments ``m1``, ``m2`` and
        width ``w``, contributes the smaller of ``m e^{t l_max}`` (``l_min``
        for ``t < 0``) and ``e^{t c} (m + |t m1| + t^2 m2 e^{|t| w} / 2)``
        (Taylor's theorem: ``e^x <= 1 + x + x^2 e^{|x|} / 2``): both upper
        bounds, the second loose only to third order in ``t w``.
        """
        t = np.atleast_1d(np.asarray(t, dtype=float))
        if self._log_mass.size == 0:
            return np.full(t.size, -np.inf)
        out = np.empty(t.size)
        chunk = max(1, 2_000_000 // self._log_mass.size)
        binned = bool(np.any(self._width > 0))
        for s in range(0, t.size, chunk):
            tt = t[s : s + chunk, None]
            if not binned:
                # point masses (lo is hi): the same sums, in one buffer
                crude = np.multiply(tt, self._hi[None, :])
                crude += self._log_mass[None, :]
                out[s : s + chunk] = _lse_rows(crude, overwrite=True)
                continue
            ell = np.where(tt >= 0.0, self._hi[None, :], self._lo[None, :])
            crude = self._log_mass[None, :] + tt * ell
            if binned:
                tw = np.minimum(np.abs(tt) * self._width[None, :], 600.0)
                inner = (
                    self._mass[None, :]
                    + np.abs(tt) * self._first[None, :]
                    + 0.5 * tt * tt * self._second[None, :] * np.exp(tw)
                )
                with np.errstate(divide="ignore"):
                    taylor = tt * self._centre[None, :] + np.log(inner)
                crude = np.minimum(crude, taylor)
            out[s : s + chunk] = _lse_rows(crude)
        return out

    def moments(self, t: float) -> tuple[float, float]:
        """Mean and variance of the binned loss tilted by ``t`` (for scales)."""
        mid = self._centre
        if mid.size == 0:
            return 0.0, 0.0
        a = self._log_mass + t * mid
        w = np.exp(a - np.max(a))
        w /= np.sum(w)
        mean = float(np.sum(w * mid))
        var = float(np.sum(w * (mid - mean) ** 2))
        var += float(np.sum(w * (0.5 * (self._hi - self._lo)) ** 2))
        return mean, var


#: The Dist of each PMF still alive (one round's PLDs are kept between the
#: queries of a run, and each query composes the same ones again).
_DISTS: weakref.WeakKeyDictionary[pld_pmf.PLDPmf, Dist] = weakref.WeakKeyDictionary()


def dist_of(pmf: pld_pmf.PLDPmf) -> Dist:
    """``Dist(pmf)``, built once per PMF object (PMFs are not changed once built)."""
    dist = _DISTS.get(pmf)
    if dist is None:
        dist = _DISTS[pmf] = Dist(pmf)
    return dist


class Mix:
    """One round that draws a public label: ``w_j`` for ``x_j`` composed ``k_j`` times.

    With probability ``w_j`` the round releases the ``k_j``-fold composition
    of PMF ``x_j`` (and the adversary sees which); with the remaining
    probability ``rest`` it releases nothing (loss 0). Its PMF is ``rest
    delta_0 + sum_j w_j x_j^{*k_j}``, and its Fourier transform the same
    polynomial in the transforms of the ``x_j``, which :func:`compose`
    evaluates directly (no composed PMF is ever formed for a term). A plain
    PMF is the one-term mix ``(1, x, 1)``.

    Parameters
    ----------
    terms : sequence of (float, Dist, int)
        ``(w_j, x_j, k_j)``, on one grid and of one kind.
    rest : float, optional
        The probability of no release.
    """

    def __init__(self, terms: Sequence[tuple[float, Dist, int]], rest: float = 0.0):
        kept = [(float(w), d, int(k)) for w, d, k in terms if w > 0]
        if not kept:
            raise ValueError("a mix needs a term of positive weight")
        self.terms = kept
        self.rest = max(float(rest), 0.0)
        first = kept[0][1]
        self.step = first.step
        self.pessimistic = first.pessimistic
        lows = [k * d.offset for _, d, k in kept]
        highs = [k * (d.offset + d.size - 1) for _, d, k in kept]
        if self.rest > 0:
            lows.append(0)
            highs.append(0)
        #: Index of the lowest loss and number of grid points of the support.
        self.offset = min(lows)
        self.size = max(highs) - self.offset + 1
        self.infinity_mass = min(
            1.0,
            sum(
                w * -math.expm1(k * math.log1p(-min(d.infinity_mass, 1.0 - 1e-300)))
                for w, d, k in kept
            ),
        )
        self.mass = self.rest + sum(w * d.mass**k for w, d, k in kept)
        #: The longest PMF transformed (the FFT must hold each whole).
        self.longest = max(d.size for _, d, _ in kept)

    @classmethod
    def of(cls, part: Dist | Mix) -> Mix:
        """``part`` itself, or a plain PMF as a one-term mix."""
        return part if isinstance(part, Mix) else cls([(1.0, part, 1)])

    @property
    def min_loss(self) -> float:
        """Smallest loss carrying mass."""
        return self.offset * self.step

    @property
    def max_loss(self) -> float:
        """Largest loss carrying mass."""
        return (self.offset + self.size - 1) * self.step

    def log_mgf(self, t: np.ndarray) -> np.ndarray:
        """Upper bound on the log moment generating function (vectorised)."""
        t = np.atleast_1d(np.asarray(t, dtype=float))
        if self.rest == 0 and len(self.terms) == 1 and self.terms[0][::2] == (1.0, 1):
            # a plain PMF (Mix.of): its own MGF, as the sum below would give it
            own = self.terms[0][1].log_mgf(t)
            return np.where(np.isfinite(own), own, -np.inf)
        logs = [np.log(w) + k * d.log_mgf(t) for w, d, k in self.terms]
        if self.rest > 0:
            logs.append(np.full(t.size, math.log(self.rest)))
        return _lse_rows(np.stack(logs, axis=1))

    def moments(self, t: float) -> tuple[float, float]:
        """Mean and variance of the loss tilted by ``t`` (for scales)."""
        logw, means, second = [], [], []
        for w, d, k in self.terms:
            mean, var = d.moments(t)
            logw.append(math.log(w) + k * float(d.log_mgf(np.array([t]))[0]))
            means.append(k * mean)
            second.append(k * var + (k * mean) ** 2)
        if self.rest > 0:
            logw.append(math.log(self.rest))
            means.append(0.0)
            second.append(0.0)
        lw = np.asarray(logw)
        weights = np.exp(lw - np.max(lw))
        weights /= np.sum(weights)
        mean = float(np.sum(weights * np.asarray(means)))
        return mean, max(float(np.sum(weights * np.asarray(second))) - mean**2, 0.0)


Parts = Sequence[tuple["Dist | Mix", int]]


def _log_mgf_total(parts: Parts, t: np.ndarray) -> np.ndarray:
    out = np.zeros(np.atleast_1d(t).size)
    for dist, count in parts:
        out = out + count * dist.log_mgf(t)
    return out


def _composed_infinity(parts: Parts, *, upward: bool) -> float:
    """``1 - prod (1 - inf_i)^{n_i}``, rounded up (or down)."""
    if any(d.infinity_mass >= 1.0 for d, _ in parts):
        return 1.0
    s = sum(n * math.log1p(-d.infinity_mass) for d, n in parts)
    value = -math.expm1(s)
    return min(1.0, value * (1 + 1e-12) if upward else value * (1 - 1e-12))
