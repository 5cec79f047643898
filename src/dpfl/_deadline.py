"""A time limit on a computation whose cost grows with its inputs.

:func:`time_limit` bounds a block (an accounting query, a calibration) to a
number of seconds with ``SIGALRM``: past it, :class:`TimeLimitExceeded` (an
:class:`~dpfl.errors.InvalidParameterError`, so the command line prints it
as one line with exit status 2) is raised inside the block, with a message
that names the inputs. Outside the main thread, where signals cannot be
handled, the block runs without a limit. A limit already running (an outer
``time_limit``, a test harness's alarm) is kept: the inner one never extends
it, and the outer one is restored, less the time spent, when the block ends.

Code that catches every exception can swallow the one raised from the
signal handler (a fork handler does, when the alarm lands while a worker
process is being started): a block whose alarm went off is refused when it
ends, whatever became of the exception. (The alarm is not repeated: a
repeat could land in the clean-up of the first one, e.g. while the workers
are being terminated, and stop it half-way.)
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from dpfl.errors import InvalidParameterError

__all__ = ["ANSWER_SECONDS", "TimeLimitExceeded", "time_limit"]

#: The time a command's computation may take before it is refused: the
#: command line answers every input within a minute (its start-up, the
#: imports, takes a few seconds of it).
ANSWER_SECONDS = 50.0


class TimeLimitExceeded(InvalidParameterError):
    """The computation did not finish within its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float, message: str) -> Iterator[None]:
    """Raise :class:`TimeLimitExceeded` with ``message`` if the block runs too long.

    Parameters
    ----------
    seconds : float
        The limit.
    message : str
        The error's message (name the inputs and what to change).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    outer_handler = signal.getsignal(signal.SIGALRM)
    outer_left, _ = signal.getitimer(signal.ITIMER_REAL)
    if outer_left and outer_left <= seconds:
        yield  # the limit already running ends first
        return

    expired = False

    def on_alarm(signum: int, frame: Any) -> None:
        nonlocal expired
        expired = True
        raise TimeLimitExceeded(message)

    start = time.monotonic()
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
        if expired:  # the alarm's exception was swallowed inside the block
            raise TimeLimitExceeded(message)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, outer_handler)
        if outer_left:
            left = outer_left - (time.monotonic() - start)
            signal.setitimer(signal.ITIMER_REAL, max(left, 1e-3))
