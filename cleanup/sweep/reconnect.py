"""A pass outlives its database: a statement that lost its connection is sent again.

PostgreSQL restarts (a failover, an upgrade, a crash) take every session with them. A
pass that meets a lost connection at any of its statements closes it, waits a little
(`BACKOFF_S`, then every `BACKOFF_S[-1]`) and sends the statement again on a new one, for
as long as its caller allows: a verdict while its claim holds, a read for `READ_FOR_S`.
Every statement it retries is safe to send twice: the reads read, the marks and the
verdicts are fenced by their claim. The outage is logged once when it begins and once
when the database answers again, not once per try.
May import: Django only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import InterfaceError, OperationalError, connection

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

# What a lost connection raises (Django's wrappers of psycopg's errors).
LOST = (OperationalError, InterfaceError)
# How long to wait before each try: short at first, so a pass resumes within a second of
# the server's return, and never longer than the last.
BACKOFF_S = (0.05, 0.1, 0.2, 0.3, 0.5)
# How long a read of the pass waits for the database before the pass gives up for now.
READ_FOR_S = 60.0

_outage: dict[str, float | None] = {"since": None}


def retried(fn: Callable[..., _T], *args: Any, until: float | None = None, what: str = "", **kwargs: Any) -> _T:
    """``fn(*args, **kwargs)``, sent again on a new connection while it loses its
    connection, until the monotonic time ``until`` (default: `READ_FOR_S` from now); then
    the last error is raised. Inside a caller's transaction nothing is retried: the
    transaction is lost with its connection, and the caller's retry sends it whole."""
    until = time.monotonic() + READ_FOR_S if until is None else until
    tries = 0
    while True:
        try:
            answer = fn(*args, **kwargs)
        except LOST as error:
            if _in_transaction():
                raise
            _lost(error, what)
            connection.close()
            delay = BACKOFF_S[min(tries, len(BACKOFF_S) - 1)]
            if time.monotonic() + delay >= until:
                raise
            time.sleep(delay)
            tries += 1
            continue
        _answered()
        return answer


def lost(error: BaseException) -> bool:
    """Is ``error`` a lost connection to the database?"""
    return isinstance(error, LOST)


def _in_transaction() -> bool:
    """An atomic block of the caller's is open (not the one a test case wraps each test in)."""
    return any(not getattr(block, "_from_testcase", False) for block in connection.atomic_blocks)


def note_lost(error: BaseException, what: str = "") -> None:
    """A caller outside a pass met a lost connection: logged once for the outage, like the
    pass's own (the next statement that answers ends it)."""
    _lost(error, what)


def _lost(error: BaseException, what: str) -> None:
    if _outage["since"] is None:
        _outage["since"] = time.monotonic()
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        logger.warning(
            "the database connection was lost%s (%s); the pass waits for it and tries again",
            f" while {what}" if what else "",
            first_line,
        )


def _answered() -> None:
    since = _outage["since"]
    if since is not None:
        _outage["since"] = None
        logger.warning("the database answers again, after %.1f s", time.monotonic() - since)
