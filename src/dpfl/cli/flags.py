"""How ``dpfl`` reads its flags: one domain per numeric flag, errors on one line.

Every numeric flag has a domain (:data:`FLAG_DOMAINS`, by destination),
bounded where the cost of a computation grows with the value
(:data:`~dpfl._validate.MAX_ROUNDS`, :data:`MAX_RECORDS`); a command that
bounds a flag more narrowly says so where it adds the flag (:func:`narrow`).
:func:`check_flags` gives every numeric flag its domain when the parser is
built and refuses a numeric flag without one. A value outside its domain, and
every other error, is reported on one line (:func:`one_line`) with exit
status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from typing import Any, NoReturn

from dpfl._validate import (
    MAX_CALIBRATED_EPSILON,
    MAX_EPSILON,
    MAX_ROUNDS,
    MAX_SEED,
    MIN_DELTA,
    NOISE_RANGE,
    parse_number,
)

__all__ = [
    "CALIBRATED_EPSILON",
    "EXIT_INTERRUPTED",
    "FLAG_DOMAINS",
    "MAX_CLIENTS",
    "MAX_RECORDS",
    "MAX_TRIALS",
    "Domain",
    "Parser",
    "check_flags",
    "drop_option",
    "narrow",
    "one_line",
]

#: Exit status on Ctrl-C (128 + SIGINT, the shell's convention).
EXIT_INTERRUPTED = 130

#: The most characters of an error line (the user's values in it are cut).
ERROR_LIMIT = 500


def one_line(message: str, limit: int = ERROR_LIMIT) -> str:
    """``message`` on one line of at most ``limit`` characters.

    Control characters (a newline in a value a user passed) are escaped, and
    a message longer than ``limit`` (one that quotes a long value) is cut in
    the middle, keeping its start and, where the whole message was read, its
    end (where dpfl's messages say what to do).

    Parameters
    ----------
    message : str
        An error message.
    limit : int
        The most characters kept.

    Returns
    -------
    str
        The message, printable and on one line.
    """
    total = len(message)
    message = re.sub(r"\s*\n\s*", " ", message[: 4 * limit])  # lines joined
    text = "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
        for c in message[: 2 * limit]
    )
    if len(text) > limit or total > 2 * limit:
        # keep the start (what failed) and the end (what to do about it)
        total = max(total, len(text))
        tail = text[-(limit // 3) :] if total <= 2 * limit else ""
        note = f" ... ({total} characters in all) ... "
        text = f"{text[: limit - len(tail) - len(note)]}{note}{tail}"
    return text


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Show each option's default, unless its help already names it or it has none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        if not action.option_strings:
            return text
        return text + " (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit status 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Exit with status 2 and the message on one line."""
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


# ---------------------------------------------------------------------------
# Flag domains: every number a flag takes is checked where it is parsed
# ---------------------------------------------------------------------------
#: The most records per client (and records in a batch or data set) the
#: accounting commands accept: the per-client binomial mixtures hold d + 1
#: terms.
MAX_RECORDS = 10_000_000

#: The most clients a command accepts (ratios such as m / K stay exact).
MAX_CLIENTS = 10**9

#: The most trials an audit runs on each side of its pair.
MAX_TRIALS = 10**8


@dataclasses.dataclass(frozen=True)
class Domain:
    """The values a numeric flag accepts; ``kind`` is ``int`` or ``float``."""

    kind: type
    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    why: str = ""

    def describe(self) -> str:
        """``an integer in [1, 10]`` or ``a number in (0, 1]``, and why."""
        if self.kind is int:
            return f"an integer in [{int(self.low)}, {int(self.high)}]{self.why}"
        lo = "(" if self.low_open else "["
        hi = ")" if self.high_open else "]"
        return f"a number in {lo}{self.low:g}, {self.high:g}{hi}{self.why}"

    def __call__(self, text: str) -> Any:
        """Parse ``text`` as a value of the domain (argparse's ``type``)."""
        from dpfl._validate import shown

        bad = argparse.ArgumentTypeError(
            f"must be {self.describe()}; got {shown(text)}"
        )
        try:  # the one spelling of a number (dpfl._validate.parse_number)
            value: Any = parse_number(text, integer=self.kind is int)
        except ValueError:
            raise bad from None
        if self.kind is float:
            value = float(value)
        if math.isnan(value):
            raise bad
        low_ok = value > self.low if self.low_open else value >= self.low
        high_ok = value < self.high if self.high_open else value <= self.high
        if not (low_ok and high_ok):
            raise bad
        return value


def _ints(low: int, high: int, why: str = "") -> Domain:
    return Domain(int, low, high, why=why)


_PROBABILITY = Domain(float, 0.0, 1.0, low_open=True)
_OPEN_UNIT = Domain(float, 0.0, 1.0, low_open=True, high_open=True)
_DELTA = Domain(
    float,
    MIN_DELTA,
    1.0,
    high_open=True,
    why=" (below 1e-15 the accounting's double-precision rounding exceeds delta)",
)
_POSITIVE = Domain(float, 0.0, math.inf, low_open=True, high_open=True)
_EPSILON = Domain(
    float, 0.0, MAX_EPSILON, low_open=True, why=" (e^epsilon must stay finite)"
)
#: The ε ``dpfl calibrate`` calibrates to (its ``epsilon`` flag, :func:`narrow`).
CALIBRATED_EPSILON = {
    "high": MAX_CALIBRATED_EPSILON,
    "why": " (no guarantee is left past it, and the noise it allows is too small "
    "to price in bounded time)",
}
_ROUNDS = _ints(1, MAX_ROUNDS, " (the range the accounting answers in bounded time)")
_RECORDS = _ints(1, MAX_RECORDS, " (the accounting's memory grows with it)")
_NOISE = Domain(
    float,
    *NOISE_RANGE,
    why=" (below, the privacy loss overflows; above, every epsilon is 0)",
)

#: The domain of each numeric flag, by its destination; a command may bound
#: one more narrowly (:func:`narrow`). Every ``type=int`` or ``type=float``
#: flag must have one (:func:`check_flags` refuses a parser otherwise).
FLAG_DOMAINS: dict[str, Domain] = {
    "p": _PROBABILITY,
    "q": _PROBABILITY,
    "q1": _PROBABILITY,
    "max_p2": _PROBABILITY,
    "probability": _PROBABILITY,
    "sync_probability": _PROBABILITY,
    "participation": _PROBABILITY,
    "delta": _DELTA,
    "local_delta": _DELTA,
    "confidence": _OPEN_UNIT,
    "threshold": _DELTA,
    "epsilon": _EPSILON,
    "local_epsilon": _EPSILON,
    "noise_multiplier": _NOISE,
    "sensitivity": _POSITIVE,
    "norm_noise_ratio": _POSITIVE,
    "xi": _POSITIVE,
    "clip": _POSITIVE,
    "angle": Domain(float, 0.0, 180.0, why=" degrees"),
    "rounds": _ROUNDS,
    "local_steps": _ROUNDS,
    "steps": _ROUNDS,
    "epochs": _POSITIVE,
    "rounds_joined": _ints(0, MAX_ROUNDS),
    "norm_rounds": _ints(0, MAX_ROUNDS),
    "update_rounds": _ints(0, MAX_ROUNDS),
    "records_per_client": _RECORDS,
    "batch_size": _RECORDS,
    "dataset_size": _RECORDS,
    "clients": _ints(1, MAX_CLIENTS),
    "num_clients": _ints(1, MAX_CLIENTS),
    "cohort": _ints(1, MAX_CLIENTS),
    "trials": _ints(1, MAX_TRIALS, " (an audit's time grows with it)"),
    "seed": _ints(0, MAX_SEED),
    "seeds": _ints(1, 1_000),
    "jobs": _ints(1, 1_024),
    "canaries": _ints(1, 100_000),
    "runs": _ints(1, 1_000),
    "hidden": _ints(1, 100_000),
}


def narrow(parser: argparse.ArgumentParser, dest: str, **changes: Any) -> None:
    """Bound the flag ``dest`` of ``parser`` more narrowly than its domain.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The command's parser, with the flag added.
    dest : str
        The flag's destination (a key of :data:`FLAG_DOMAINS`).
    **changes
        The fields of its :class:`Domain` that change (``high=10_000``).

    Raises
    ------
    TypeError
        If the parser has no such numeric flag (a programming error).
    """
    for action in parser._actions:
        if action.dest == dest and action.type is FLAG_DOMAINS[dest].kind:
            action.type = dataclasses.replace(FLAG_DOMAINS[dest], **changes)
            return
    raise TypeError(f"{parser.prog!r} has no numeric flag {dest!r} to narrow")


def check_flags(parser: argparse.ArgumentParser) -> None:
    """Give every numeric flag of ``parser`` and its sub-parsers its domain.

    Raises
    ------
    TypeError
        If a numeric flag has no domain (a programming error: a new flag
        needs an entry in :data:`FLAG_DOMAINS`).
    """
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                check_flags(sub)
            continue
        if isinstance(action.type, Domain):  # narrowed by its command
            domain = action.type
        elif action.type in (int, float):
            found = FLAG_DOMAINS.get(action.dest)
            if found is None or found.kind is not action.type:
                raise TypeError(  # a programming error: a new flag without a domain
                    f"flag {action.option_strings} of {parser.prog!r} has no domain"
                )
            domain = found
        else:
            continue
        action.type = domain
        action.metavar = action.metavar or action.dest.upper()
        if domain.why and action.help and domain.high < math.inf:
            action.help += f"; {domain.describe()}"


def drop_option(parser: argparse.ArgumentParser, flag: str) -> None:
    """Remove an option that shared argument helpers added but ``parser`` lacks."""
    for action in list(parser._actions):
        if flag in action.option_strings:
            parser._remove_action(action)
            for group in parser._action_groups:
                if action in group._group_actions:
                    group._group_actions.remove(action)
            for option in action.option_strings:
                parser._option_string_actions.pop(option, None)
