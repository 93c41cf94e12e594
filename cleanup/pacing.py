"""Pacing: the calls a second a module's backend takes, kept by every process of the site.

An action or a lease may declare ``max_rate`` (calls a second) and ``max_burst`` (calls at
once before the rate applies, 1 when unset). Every call to one backend of that module then
takes its turn from one shared schedule (a GCRA token bucket: each call moves the
backend's "theoretical arrival time" one interval on, and waits while it is more than
``max_burst`` intervals ahead of now). The schedule lives on Redis when ``REDIS_URL`` is
set (one script, atomic), else in the database (the table ``cleanup_pace``, one
``INSERT … ON CONFLICT DO UPDATE`` whose row lock orders the callers), so all workers,
machines and commands of a site share it, and the clock is the store's.

A call waiting for its turn is no failure: it waits before the call starts, outside the
call's budget, and then it is made. A store that cannot be reached paces nothing (logged
once a minute at most): pacing must never be the reason a call fails.
May import: conf only.
"""

import logging
import math
import threading
import time
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections

logger = logging.getLogger(__name__)

# The longest a call waits for its turn: past it the call is made anyway (a schedule that
# far ahead means a store gone wrong, and a claim would expire meanwhile).
MAX_WAIT_S = 60.0
_REDIS_SCRIPT = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) + tonumber(now_parts[2]) / 1000000
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
tat = tat + tonumber(ARGV[1])
redis.call('SET', KEYS[1], string.format('%.6f', tat), 'PX', math.ceil((tat - now) * 1000) + 1000)
return string.format('%.6f', tat - now)
"""
_SQL = """
INSERT INTO cleanup_pace AS p (key, tat)
VALUES (%s, extract(epoch from clock_timestamp()) + %s)
ON CONFLICT (key) DO UPDATE SET tat = GREATEST(p.tat, extract(epoch from clock_timestamp())) + %s
RETURNING p.tat - extract(epoch from clock_timestamp())
"""


def limits(entry: object) -> tuple[float, int] | None:
    """``(max_rate, max_burst)`` an action or lease declares, or None when it sets no rate."""
    rate = getattr(entry, "max_rate", None)
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) or rate <= 0:
        return None
    burst = getattr(entry, "max_burst", None)
    burst = burst if isinstance(burst, int) and not isinstance(burst, bool) and burst > 0 else 1
    return float(rate), burst


def key_of(module: str, backend: str) -> str:
    return f"{module}\x1f{backend}"


def _ahead_redis(url: str, key: str, interval: float) -> float:
    import redis

    client = _redis_clients.get(url)
    if client is None:
        client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        _redis_clients[url] = client
    prefix = str(getattr(settings, "Q_CLUSTER", {}).get("name", "events"))
    answer: Any = client.eval(_REDIS_SCRIPT, 1, f"{prefix}:pace:{key}", f"{interval:.6f}")
    return float(answer)


_redis_clients: dict[str, Any] = {}


def _ahead_db(key: str, interval: float) -> float:
    with connections["default"].cursor() as cursor:
        cursor.execute(_SQL, [key, interval, interval])
        row = cursor.fetchone()
    return float(row[0]) if row else 0.0


def reserve(module: str, backend: str, rate: float, burst: int) -> float:
    """Take the next turn of ``module``'s ``backend``; answers how many seconds to wait for
    it (0 when it is now). Never raises: a store that fails answers 0."""
    interval = 1.0 / rate
    key = key_of(module, backend)
    url = getattr(settings, "REDIS_URL", "") or ""
    try:
        ahead = _ahead_redis(url, key, interval) if url else _ahead_db(key, interval)
    except (DatabaseError, OSError, ImportError, ValueError) as exc:
        _complain(exc)
        return 0.0
    except Exception as exc:  # redis' own errors, whatever their class
        _complain(exc)
        return 0.0
    return max(0.0, ahead - burst * interval)


_complained = [0.0]
_complain_lock = threading.Lock()


def _complain(exc: BaseException) -> None:
    with _complain_lock:
        if time.monotonic() - _complained[0] < 60:
            return
        _complained[0] = time.monotonic()
    logger.warning("pacing could not reach its store, so calls go unpaced: %s: %s", type(exc).__name__, exc)


def wait_turn(entry: object, module: str, backend: str) -> float:
    """Wait for the turn of a call to ``entry`` (an action or a lease) on ``backend``, when it
    declares ``max_rate``; answers the seconds waited."""
    declared = limits(entry)
    if declared is None:
        return 0.0
    wait = min(reserve(module, backend, *declared), MAX_WAIT_S)
    if wait > 0:
        logger.debug("a call to %s/%s waits %.2f s for its turn", module, backend, wait)
        time.sleep(wait)
    return wait
