"""The certified envelope of a tilted composition, and its readings.

:func:`dpfl.accounting.tilted.compose` returns a :class:`CertifiedPmf`: the
computed tilted composition with its a-priori error bounds (FFT round-off,
aliasing, tilt and untilt). Its masses read as an upper envelope
(pessimistic inputs) or a lower one (optimistic inputs) of the true
composition at every loss of the window, and ``delta`` or ``epsilon`` is
read off it with the rounding of the sum bounded (:func:`summation_margin`):
the upper value at ``delta / (1 + margin)``, the lower at ``delta (1 +
margin)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from dp_accounting.pld import pld_pmf

__all__ = ["summation_margin"]


#: Unit roundoff of IEEE double precision.
UNIT_ROUNDOFF = 2.0**-53


def summation_margin(size: int) -> float:
    """Relative rounding bound of the tail sums that read delta off a PMF."""
    return 4.0 * (size + 2) * UNIT_ROUNDOFF


def _tail(c: np.ndarray, h: float) -> tuple[np.ndarray, np.ndarray]:
    """``(G, C)`` of non-negative masses ``c`` on a grid of step ``h``.

    ``G_i = sum_{j>i} c_j (1 - e^{-(j-i)h})`` and ``C_i = sum_{j>=i} c_j
    e^{-(j-i)h}``, by the recurrences ``C_{i-1} = c_{i-1} + e^{-h} C_i`` and
    ``G_{i-1} = G_i + (1 - e^{-h}) C_i`` (non-negative terms only).
    """
    from scipy import signal  # pylint: disable=import-outside-toplevel

    if c.size == 0:
        return np.zeros(0), np.zeros(0)
    rev = np.ascontiguousarray(c[::-1])
    c_rev = signal.lfilter([1.0], [1.0, -math.exp(-h)], rev)
    g_rev = np.empty(c.size)
    g_rev[0] = 0.0
    if c.size > 1:
        np.cumsum(c_rev[:-1], out=g_rev[1:])
        g_rev[1:] *= -math.expm1(-h)
    return g_rev[::-1], c_rev[::-1]


class CertifiedPmf(pld_pmf.DensePLDPmf):  # type: ignore[misc]
    """A composed PMF with its a-priori error bound (see the module docstring).

    Its masses (``_probs``, built on first use) are the pointwise envelope:
    upper bounds on the true masses for a pessimistic composition, lower
    bounds for an optimistic one, so it may be composed again or read by any
    PMF code. The reading methods here are tighter. For the weights ``W_j =
    U_j (1 - e^{eps - l_j})_+`` of ``delta(eps)``, the error of the sum is
    ``|sum_j e_j W_j| <= nu = E ||W||_2 + A max_j W_j`` (Cauchy-Schwarz on
    the FFT error's 2-norm, and the aliased mass), and ``||W||_2^2 <=
    sum_{l_j > eps} U_j^2``, a geometric sum in closed form; so

        delta <= inf + sum_j max(y^_j, 0) W_j + nu,
        delta >= inf + sum_j max(y^_j, 0) W_j - 2 nu

    (the negative computed values are below their own error, so their sum
    is at most ``nu`` too), each scaled by ``1 +- 2 rho`` and the sum's
    rounding. Points whose error bound exceeds the total mass (low losses
    of a tilted composition) are bounded by the total mass instead (upper
    side) or dropped (lower side).

    Parameters
    ----------
    step, lower_loss : float, int
        Grid step and index of the window's lowest loss.
    raw : numpy.ndarray
        The computed tilted composition on the window.
    infinity_mass : float
        Mass at +infinity (an upper bound for a pessimistic composition, a
        lower bound otherwise).
    pessimistic : bool
        Which side.
    kappa, tilt : float
        ``sum_i n_i kappa_i`` and ``lam``: ``log U_j = kappa - lam l_j``.
    error : float
        ``E``: bound on the 2-norm of the FFT's error in the tilted domain.
    alias : float
        ``A``: bound on the aliased (wrapped) tilted mass.
    rho : float
        Relative error of the tilt and untilt.
    cap : float
        Upper bound on the composition's total finite mass.
    lump : float
        Pessimistic side: mass below the window, put on its lowest loss.
    """

    def __init__(
        self,
        step: float,
        lower_loss: int,
        raw: np.ndarray,
        infinity_mass: float,
        pessimistic: bool,
        *,
        kappa: float,
        tilt: float,
        error: float,
        alias: float,
        rho: float,
        cap: float,
        lump: float,
    ) -> None:
        self.raw = raw
        self.kappa = kappa
        self.tilt = tilt
        self.error = error
        self.alias = alias
        self.rho = rho
        self.cap = cap
        self.lump = lump
        self._envelope: np.ndarray | None = None
        super().__init__(step, lower_loss, raw, infinity_mass, pessimistic)
        n = raw.size
        self._margin = summation_margin(n)
        # readings concern eps >= 0: only the points from loss 0 up
        self._start = min(max(0, -int(lower_loss)), n)
        # J2 = [0, first): points whose error bound exceeds the total mass
        point = max(error + alias, 1e-300)
        excess = kappa + math.log(point) - math.log(cap)
        if tilt > 0:
            # log U_j + log(point) < log cap  <=>  l_j > excess / tilt
            j = math.floor(excess / tilt / step + 1e-9) - int(lower_loss) + 1
            self._first = min(max(j, 0), n)
        else:
            self._first = n if excess >= 0 else 0
        self._tails: tuple[np.ndarray, np.ndarray] | None = None

    # the envelope is built on first use (the readings below do not need it)
    @property
    def _probs(self) -> np.ndarray:
        if self._envelope is None:
            self._envelope = self._build_envelope()
        return self._envelope

    @_probs.setter
    def _probs(self, value: np.ndarray) -> None:
        pass  # set by the base class to ``raw``; the envelope replaces it

    @property
    def size(self) -> int:
        """Number of grid points of the window."""
        return int(self.raw.size)

    def _loss(self, i: int) -> float:
        return float((self._lower_loss + i) * self._discretization)

    def _u_from(self, start: int) -> np.ndarray:
        """``U_j`` for ``j >= start`` (0 on J2)."""
        idx = np.arange(start, self.raw.size)
        log_u = self.kappa - self.tilt * (self._lower_loss + idx) * self._discretization
        log_u = np.where(idx < self._first, -np.inf, log_u)
        with np.errstate(under="ignore"):
            return np.asarray(np.exp(log_u))

    def _build_envelope(self) -> np.ndarray:
        u = self._u_from(0)
        point = self.error + self.alias
        raw, rho, cap = self.raw, self.rho, self.cap
        trivial = np.arange(raw.size) < self._first
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            if self._pessimistic_estimate:
                env = (np.maximum(raw, 0.0) + point) * u * (1 + 2 * rho)
                env = np.where(trivial, cap, np.minimum(cap, env))
                env[0] = min(cap, env[0] + self.lump)
            else:
                v = raw - point
                env = np.where((v > 0.0) & ~trivial, v * u * (1 - 2 * rho), 0.0)
        return np.asarray(env)

    def _pos(self) -> tuple[np.ndarray, np.ndarray]:
        """Tail sums ``(G, C)`` of ``max(y^, 0) U`` on J1, from ``start``."""
        if self._tails is None:
            raw = self.raw[self._start :]
            c = np.maximum(raw, 0.0) * self._u_from(self._start)
            self._tails = _tail(c, self._discretization)
        return self._tails

    def _noise(self, i: np.ndarray) -> np.ndarray:
        """``nu`` for the points ``j >= i`` (vectorised over ``i``)."""
        n = self.raw.size
        i1 = np.maximum(i, self._first)
        count = np.maximum(n - i1, 0)
        log_u = self.kappa - self.tilt * (self._lower_loss + i1) * self._discretization
        with np.errstate(over="ignore", under="ignore"):
            u = np.where(count > 0, np.exp(log_u), 0.0)
        if self.tilt > 0:
            log_a = -2.0 * self.tilt * self._discretization
            geo = -np.expm1(count * log_a) / -math.expm1(log_a)
        else:
            geo = count.astype(float)
        return np.asarray(
            (self.error * u * np.sqrt(geo) + self.alias * u) * (1 + 1e-10)
        )

    def _trivial(self, i: np.ndarray) -> np.ndarray:
        """Upper side: ``cap`` times the number of J2 points ``j >= i``."""
        return np.asarray(self.cap * np.maximum(self._first - i, 0))

    # -- reading --------------------------------------------------------------
    def _value(self, i: int, x: float, *, upper: bool, with_lump: float = 0.0) -> float:
        """Certified delta at ``1 - e^{eps - l_i} = x`` (points ``j >= i``)."""
        return self._reader(i, upper=upper)(x, with_lump)

    def _reader(self, i: int, *, upper: bool) -> Callable[[float, float], float]:
        """:meth:`_value` at interval ``i`` as ``(x, with_lump) -> delta``.

        What does not depend on ``x`` is read once (a bisection calls it 56
        times on one interval); the arithmetic is :meth:`_value`'s.
        """
        g, c = self._pos()
        r = i - self._start
        g_r, c_r = float(g[r]), float(c[r])
        nu = float(self._noise(np.array([i]))[0])
        s, rho, inf = self._margin, self.rho, self._infinity_mass
        if upper:
            trivial, lump = float(self._trivial(np.array([i]))[0]), self.lump

            def up(x: float, with_lump: float) -> float:
                total = ((g_r + c_r * x) * (1 + s) + nu) * (1 + 2 * rho)
                total += trivial + lump * with_lump
                return float(min(1.0, inf + total))

            return up

        def low(x: float, with_lump: float) -> float:
            total = (g_r + c_r * x) * (1 - s) - 2.0 * nu
            return float(max(0.0, inf + total * (1 - 2 * rho)))

        return low

    def _at(self, epsilon: float, *, upper: bool) -> float:
        """Certified delta(eps) (upper or lower) at any ``eps >= 0``."""
        h = self._discretization
        i = max(int(math.floor(epsilon / h + 1e-9)) - self._lower_loss + 1, 0)
        while i > 0 and self._loss(i - 1) > epsilon:
            i -= 1
        while i < self.raw.size and self._loss(i) <= epsilon:
            i += 1
        if i >= self.raw.size:
            return float(self._infinity_mass)
        i = max(i, self._start)
        x = -math.expm1(epsilon - self._loss(i))
        lump = -math.expm1(epsilon - self._loss(0)) if i == 0 else 0.0
        return self._value(i, x, upper=upper, with_lump=lump)

    def noise(self, epsilon: float) -> float:
        """``nu``: the error bound of the readings at ``eps`` (points above it)."""
        h = self._discretization
        i = max(int(math.floor(epsilon / h + 1e-9)) - self._lower_loss + 1, 0)
        return float(self._noise(np.array([min(i, self.raw.size)]))[0])

    def delta_upper(self, epsilon: float) -> float:
        """An upper bound on the true composition's delta(eps >= 0)."""
        return self._at(max(epsilon, 0.0), upper=True)

    def delta_lower(self, epsilon: float) -> float:
        """A lower bound on the true composition's delta(eps >= 0)."""
        return self._at(max(epsilon, 0.0), upper=False)

    def _grid_values(self, rows: np.ndarray, *, upper: bool) -> np.ndarray:
        """Certified delta at the grid losses ``rows`` (>= start; points above)."""
        g, _ = self._pos()
        nxt = rows + 1
        nu = self._noise(nxt)
        s = self._margin
        gi = g[rows - self._start]
        if upper:
            vals = (gi * (1 + s) + nu) * (1 + 2 * self.rho) + self._trivial(nxt)
            return np.asarray(np.minimum(1.0, self._infinity_mass + vals))
        vals = gi * (1 - s) - 2.0 * nu
        return np.asarray(
            np.maximum(0.0, self._infinity_mass + vals * (1 - 2 * self.rho))
        )

    def _first_at_most(self, delta: float) -> int:
        """First grid index from ``start`` whose upper value is <= delta.

        The upper value is non-increasing in the loss: a search that reads
        up to 64 evenly spaced points at once and keeps the interval between
        the last above ``delta`` and the first not (the answer bisection
        would give, in a few vectorised readings instead of ~log2(n)).
        Returns the window's size when there is none.
        """
        lo, hi = self._start, self.raw.size  # answer in [lo, hi]
        while lo < hi:
            n = min(hi - lo, 64)
            rows = np.unique(np.linspace(lo, hi - 1, n).astype(np.int64))
            below = np.flatnonzero(self._grid_values(rows, upper=True) <= delta)
            if below.size == 0:
                lo = int(rows[-1]) + 1
            else:
                k = int(below[0])  # rows[0] is lo: k = 0 is the answer
                hi = int(rows[k])
                lo = int(rows[k - 1]) + 1 if k > 0 else hi
        return lo

    def _last_above(self, delta: float) -> int:
        """Last grid index from ``start`` whose lower value is > delta (or -1).

        The lower value is at most the mass sum's, which is non-increasing:
        past the first index where that sum is <= delta nothing is above, so
        the search goes backwards from there in blocks.
        """
        g, _ = self._pos()
        inf, s = self._infinity_mass, self._margin
        bound = inf + g * (1 - s)
        below = np.nonzero(bound <= delta)[0]
        end = int(below[0]) + self._start if below.size else self.raw.size
        block = 4096
        while end > self._start:
            rows = np.arange(max(self._start, end - block), end)
            hits = np.nonzero(self._grid_values(rows, upper=False) > delta)[0]
            if hits.size:
                return int(rows[hits[-1]])
            end -= block
            block *= 4
        return -1

    def _solve(
        self, i: int, lo_x: float, hi_x: float, delta: float, upper: bool
    ) -> float:
        """Bisect ``x in [lo_x, hi_x]`` on the interval ending at loss ``i``.

        Upper side: the largest ``x`` (smallest eps) with value <= delta.
        Lower side: the smallest ``x`` (largest eps) with value > delta.
        """
        l0, li = self._loss(0), self._loss(i)
        read = self._reader(i, upper=upper)

        def value(x: float) -> float:
            eps = li + math.log1p(-x)
            lump = -math.expm1(eps - l0) if i == 0 else 0.0
            return read(x, lump)

        # value(lo_x) <= delta < value(hi_x) throughout; 2^-56 of the step
        for _ in range(56):
            mid = 0.5 * (lo_x + hi_x)
            if value(mid) <= delta:
                lo_x = mid
            else:
                hi_x = mid
        return lo_x if upper else hi_x

    def epsilon_upper(self, delta: float) -> float:
        """Smallest eps >= 0 whose certified upper delta is <= ``delta``."""
        if self._infinity_mass >= delta:
            return math.inf
        if self.delta_upper(0.0) <= delta:
            return 0.0
        k = self._first_at_most(delta)
        if k >= self.raw.size:
            return math.inf
        lk = self._loss(k)
        left = max(self._loss(k - 1) if k > 0 else 0.0, 0.0)
        # on (left, l_k]: x = 1 - e^{eps - l_k} in [0, 1 - e^{left - l_k})
        x = self._solve(k, 0.0, -math.expm1(left - lk), delta, upper=True)
        eps = lk + math.log1p(-x)
        return max(0.0, eps) * (1 + 8 * UNIT_ROUNDOFF)

    def epsilon_lower(self, delta: float) -> float:
        """A value below the true composition's eps(delta) (optimistic side)."""
        last = self._last_above(delta)
        if last < 0:
            if self.delta_lower(0.0) <= delta:
                return 0.0
            # certified: delta(0) > delta; search (0, first loss above 0]
            k = self._start
            while k < self.raw.size and self._loss(k) <= 0.0:
                k += 1
            if k >= self.raw.size:
                return 0.0
            left = 0.0
        else:
            k = last + 1
            if k >= self.raw.size:
                return self._loss(self.raw.size - 1) * (1 - 8 * UNIT_ROUNDOFF)
            left = self._loss(k - 1)
        lk = self._loss(k)
        # on (left, l_k): the value at left is > delta; find the largest eps
        x = self._solve(k, 0.0, -math.expm1(left - lk), delta, upper=False)
        eps = lk + math.log1p(-x)
        return max(0.0, eps * (1 - 8 * UNIT_ROUNDOFF))
