"""The counters every process of the site shares: where they are kept.

The API's throttles (`cleanup.api.throttles`), the failed-token lockout
(`cleanup.api.tokens`) and the error mail's bound (`cleanup.errormail`) count in the
cache named `COUNTERS_CACHE` (``counters``), else the default one. The example site puts
it on Redis when ``REDIS_URL`` is set, else in the database (Django's database cache, on
the table ``cleanup_counters`` the app's migrations make), so that three workers count one
limit together. A cache in a process's own memory (``LocMemCache``) or none
(``DummyCache``) would count apart per process, or not at all: `per_process()` says so, and
``check --deploy`` warns (``cleanup.W031``).

On Redis, `SharedRedisPool` gives each process one connection pool per server: Django keeps
a cache object per thread and, under ASGI, per request, each with a pool of its own, so
every API request opened a connection to Redis and left it to the garbage collector.

`CountersCache` is Django's database cache with each write one statement: an upsert
(``INSERT … ON CONFLICT DO UPDATE``) instead of a count of the table, a read and an update
in a transaction; the expired entries are deleted every `CULL_EVERY` writes of a process.
Every API request writes its user's count, so this is what the database cache costs.
May import: nothing of the app (Django only).
"""

import base64
import contextlib
import itertools
import pickle
import threading
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.cache import BaseCache, InvalidCacheBackendError, caches
from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.core.cache.backends.db import DatabaseCache
from django.db import DatabaseError, connections, router, transaction
from django.utils.timezone import now as tz_now

COUNTERS_CACHE = "counters"
TABLE = "cleanup_counters"
# The expired entries are deleted once every this many writes of a process.
CULL_EVERY = 500
# Backends whose counts one process keeps for itself, or nobody keeps.
PER_PROCESS = (
    "django.core.cache.backends.locmem.LocMemCache",
    "django.core.cache.backends.dummy.DummyCache",
)


def alias() -> str:
    """The cache the counters are kept in: `COUNTERS_CACHE` when the site names one, else the default."""
    return COUNTERS_CACHE if COUNTERS_CACHE in settings.CACHES else "default"


def counters() -> BaseCache:
    """The cache itself (`alias()`)."""
    try:
        return caches[alias()]
    except InvalidCacheBackendError:
        return caches["default"]


def per_process() -> str | None:
    """The backend of the counters' cache when it counts per process (or not at all), else None."""
    backend = str((settings.CACHES.get(alias()) or {}).get("BACKEND", ""))
    return backend if backend in PER_PROCESS or not backend else None


class SharedRedisPool:
    """The ``pool_class`` of the counters' Redis cache: `from_url` answers the process's one
    pool for that server and those options, made on first use (redis-py's pool starts
    afresh in a forked child by itself).

    The pool blocks: a thread that finds all `MAX_CONNECTIONS` connections in use waits up
    to `WAIT_S` for one (the options ``max_connections`` and ``timeout`` say otherwise). A
    pool that refused at once, as redis-py's default one does past 100, would let a burst
    of requests through uncounted: every count fails open (see the module's text)."""

    MAX_CONNECTIONS = 50
    WAIT_S = 2.0

    _pools: dict[tuple[str, str], Any] = {}
    _lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, **options: Any) -> Any:
        import redis

        key = (url, repr(sorted(options.items())))
        with cls._lock:
            pool = cls._pools.get(key)
            if pool is None:
                options = {"max_connections": cls.MAX_CONNECTIONS, "timeout": cls.WAIT_S, **options}
                pool = cls._pools[key] = redis.BlockingConnectionPool.from_url(url, **options)
        return pool


class CountersCache(DatabaseCache):
    """Django's database cache, each ``set`` and ``add`` one upsert (see the module's text)."""

    _writes = itertools.count()

    def _base_set(self, mode: str, key: str, value: Any, timeout: float | None = DEFAULT_TIMEOUT) -> bool:
        if mode not in ("set", "add"):
            written: bool = super()._base_set(mode, key, value, timeout)
            return written
        seconds = self.get_backend_timeout(timeout)
        expires = datetime.max.replace(tzinfo=UTC) if seconds is None else datetime.fromtimestamp(seconds, tz=UTC)
        now = tz_now()
        db = router.db_for_write(self.cache_model_class)
        connection = connections[db]
        table = connection.ops.quote_name(self._table)
        encoded = base64.b64encode(pickle.dumps(value, self.pickle_protocol)).decode("latin1")
        # An add replaces only an entry that has expired; a set, any.
        only_expired = f" WHERE {table}.expires < %s" if mode == "add" else ""
        sql = (
            f"INSERT INTO {table} (cache_key, value, expires) VALUES (%s, %s, %s) "
            f"ON CONFLICT (cache_key) DO UPDATE SET value = EXCLUDED.value, expires = EXCLUDED.expires{only_expired}"
        )
        params: list[Any] = [key, encoded, expires] + ([now] if mode == "add" else [])
        # Inside a caller's transaction, a savepoint keeps a failed write from breaking it;
        # outside one, the statement is its own transaction.
        inside = transaction.atomic(using=db) if connection.in_atomic_block else contextlib.nullcontext()
        try:
            with inside, connection.cursor() as cursor:
                cursor.execute(sql, params)
                written = cursor.rowcount > 0
                if next(self._writes) % CULL_EVERY == 0:
                    cursor.execute(f"DELETE FROM {table} WHERE expires < %s", [now])
        except DatabaseError:
            return False
        return written
