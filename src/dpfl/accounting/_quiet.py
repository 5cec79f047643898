"""Keep library chatter (dp_accounting's warnings, absl and root logging) quiet.

dpfl says what matters in its own words; nothing from the engines it uses
should reach the user's terminal.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence Python warnings and log records below ERROR while inside."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)
