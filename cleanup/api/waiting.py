"""Waiting on the change feed with no worker, thread or database connection per waiter.

Each event loop of the site (one per ASGI worker process) has one `Hub`: one PostgreSQL
connection that ``LISTEN``s on `cleanup.feed.CHANNEL` (every write to either log notifies
it on commit: migration 0028), and, after each notification, one read of what was placed
since its last read, kept in memory (the last `KEEP` entries, read first when it starts).
A waiting request is a coroutine parked on the hub's `asyncio.Event`: when a read finds
something, every waiter wakes and takes what it asked for from memory. However many
consoles wait, the feed is read once per change per process. The same connection listens
on `cleanup.api.tokens.CHANNEL`: a token, a user or a permission changed anywhere on the
site empties the process's memory of authentications, which may then be kept longer.

While the listening connection is lost (PostgreSQL restarted, a network cut), the hub
tries again every `RECONNECT_S`, and meanwhile each waiter reads the feed itself every
`FALLBACK_S`: slower, never deaf. A waiter whose position is older than what the hub keeps
reads the database too.

The synchronous parts (a request's checks, a read of the database) run on the process's
few `executor` threads, and the feed's requests take turns on the event loop (`TURNS` at
once; a parked one leaves its turn), so that the thousand a change wakes answer a few at
a time, with the loop's other requests served between. `let_go_of_request_thread` ends
the thread Django gives an ASGI request when a middleware needed one (a session to read),
so that a parked request holds no thread either.
May import: `feed`, `serving`, `tokens` (and Django, asgiref, psycopg).
"""

import asyncio
import bisect
import logging
import threading
import weakref
from collections.abc import Collection
from typing import Any

import psycopg
from asgiref.sync import SyncToAsync, sync_to_async
from django.db import connection, connections
from psycopg.conninfo import make_conninfo

from .. import feed
from ..serving import RequestThreads, step_aside
from . import tokens

logger = logging.getLogger("cleanup.feed")

# Entries kept in memory per process: a waiter further behind reads the database.
KEEP = 5000
# Entries read per look at the feed (more are read by the next look, at once).
READ_BATCH = 1000
# Threads per process for the feed's synchronous parts (`executor`).
THREADS = 4
# The feed's requests a process serves at once (`cleanup.serving.Turn`): the others wait
# their turn, and a parked wait leaves its turn to them.
TURNS = 8
RECONNECT_S = 1.0
FALLBACK_S = 1.0


_executor: RequestThreads | None = None
_executor_lock = threading.Lock()


def executor() -> RequestThreads:
    """The process's threads for the change feed's requests (their checks, a read of the
    database; `cleanup.serving.own_threads`): `THREADS` of them, however many consoles ask
    at once. A thousand re-asks after a change queue here, not in the queue of ``/healthz``."""
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = RequestThreads(max_workers=THREADS, thread_name_prefix="feed")
        return _executor


def conninfo() -> str:
    """The connection string of the site's database (the one Django uses)."""
    settings = connections["default"].settings_dict
    options = settings.get("OPTIONS") or {}
    params = {
        "dbname": settings.get("NAME"),
        "user": settings.get("USER"),
        "password": settings.get("PASSWORD"),
        "host": settings.get("HOST"),
        "port": settings.get("PORT"),
        **{
            k: v
            for k, v in options.items()
            if k in ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout", "application_name")
        },
    }
    return make_conninfo(**{k: str(v) for k, v in params.items() if v not in (None, "")})


def _closing(function: Any, *args: Any) -> Any:
    """``function(*args)`` on this thread's connection, given back (closed or to the pool) after."""
    try:
        return function(*args)
    finally:
        feed.release_connection()


UNSTAMPED_SQL = (
    "SELECT EXISTS (SELECT 1 FROM cleanup_runlog WHERE seq IS NULL)"
    " OR EXISTS (SELECT 1 FROM cleanup_moduleevent WHERE seq IS NULL)"
)


def read_feed(after: int, limit: int, run: int | None, kinds: Collection[str] | None) -> list[dict[str, Any]]:
    """`feed.entries_after`, holding a database connection only while it reads."""
    found: list[dict[str, Any]] = _closing(feed.entries_after, after, limit, run, kinds)
    return found


class Hub:
    """One process's listener and its memory of the feed (see the module's docstring)."""

    def __init__(self) -> None:
        # In place order; `ids` are their places, for a bisection.
        self.entries: list[dict[str, Any]] = []
        self.ids: list[int] = []
        # Every entry placed after `floor`, up to `read_to`, is in `entries` (None: not read yet).
        self.floor: int | None = None
        self.read_to: int | None = None
        self.changed = asyncio.Event()
        self.listening = False
        self.task: asyncio.Task[None] | None = None
        self.reads = 0

    def start(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._listen())

    @property
    def ready(self) -> bool:
        """Listening, and the feed read since: what is in memory is current."""
        return self.listening and self.read_to is not None

    def covers(self, after: int) -> bool:
        return self.floor is not None and after >= self.floor

    def after(self, after: int, limit: int, run: int | None, kinds: Collection[str] | None) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for entry in self.entries[bisect.bisect_right(self.ids, after) :]:
            if feed.matches(entry, run, kinds):
                found.append(entry)
                if len(found) == limit:
                    break
        return found

    def _wake(self) -> None:
        woken, self.changed = self.changed, asyncio.Event()
        woken.set()

    async def _listen(self) -> None:
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(conninfo(), autocommit=True)
                watching = False
                try:
                    await conn.execute(f"LISTEN {feed.CHANNEL}")
                    await conn.execute(f"LISTEN {tokens.CHANNEL}")
                    self.listening = watching = True
                    tokens.watching(True)
                    while True:
                        await self._read(conn)  # first what was written while nobody listened
                        # One notice at a time: those that come during a read are kept by
                        # psycopg and answered by the next read. A token, a user or a
                        # permission changed somewhere: forget the authentications.
                        while await self._notice(conn) == tokens.CHANNEL:
                            tokens.forget()
                finally:
                    self.listening = False
                    if watching:
                        tokens.watching(False)
                    await conn.close()
            except (psycopg.Error, OSError):
                logger.warning("the change feed's listener lost its connection; trying again", exc_info=True)
            self._wake()  # waiters read the database themselves until it is back
            await asyncio.sleep(RECONNECT_S)

    async def _notice(self, conn: psycopg.AsyncConnection[Any]) -> str:
        """The channel of the next notice."""
        async for notice in conn.notifies(stop_after=1):
            return notice.channel
        return feed.CHANNEL

    async def _read_last(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """The first read: the feed's last `KEEP` places, so that a console a little behind
        (one that listed, then follows; a stream resuming) is answered from memory."""
        row = await (await conn.execute("SELECT last FROM cleanup_feedsequence WHERE id = 1")).fetchone()
        last = int(row[0]) if row else 0
        floor = after = max(0, last - KEEP)
        entries: list[dict[str, Any]] = []
        while after < last:
            cursor = await conn.execute(feed.ENTRIES_SQL, {"after": after, "limit": READ_BATCH})
            new = [feed.entry_of_row(row) for row in await cursor.fetchall()]
            if not new:
                break
            entries += new
            after = new[-1]["id"]
        # Places may skip: what is held is every entry placed after `floor`, fewer than KEEP.
        self.entries, self.ids = entries, [entry["id"] for entry in entries]
        self.floor, self.read_to = floor, max(last, after)

    async def _read(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Place what was committed without a place (as `feed.stamp`), then read what was
        placed since the last read, on the listener's own connection."""
        self.reads += 1
        unstamped = await (await conn.execute(UNSTAMPED_SQL)).fetchone()
        if unstamped and unstamped[0]:
            async with conn.transaction():
                locked = (await conn.execute(feed.LOCK_SQL)).rowcount
                if locked:
                    await conn.execute(feed.STAMP_SQL, {"batch": feed.STAMP_BATCH})
            if not locked:  # the feed's first entries: the site's own stamp makes the sequence
                await sync_to_async(_closing, thread_sensitive=False, executor=executor())(feed.stamp)
        if self.read_to is None:
            await self._read_last(conn)
            self._wake()
            return
        while True:
            cursor = await conn.execute(feed.ENTRIES_SQL, {"after": self.read_to, "limit": READ_BATCH})
            new = [feed.entry_of_row(row) for row in await cursor.fetchall()]
            if not new:
                return
            # New lists, not changed in place: a waiter may be reading the old ones.
            entries, ids = self.entries + new, self.ids + [entry["id"] for entry in new]
            if len(entries) > KEEP:
                entries, ids = entries[-KEEP:], ids[-KEEP:]
                self.floor = ids[0] - 1
            self.entries, self.ids = entries, ids
            self.read_to = ids[-1]
            self._wake()
            if len(new) < READ_BATCH:
                return


_hubs: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub]" = weakref.WeakKeyDictionary()


def in_memory(after: int, limit: int, run: int | None, kinds: Collection[str] | None) -> list[dict[str, Any]] | None:
    """What the running loop's hub holds after ``after`` when it is current and holds all of it
    (a long poll's first look, with no query), else None: read the database."""
    try:
        found = _hubs.get(asyncio.get_running_loop())
    except RuntimeError:
        return None
    if found is None or not found.ready or not found.covers(after):
        return None
    return found.after(after, limit, run, kinds)


def hub() -> Hub:
    """The running event loop's hub, listening."""
    loop = asyncio.get_running_loop()
    found = _hubs.get(loop)
    if found is None:
        found = _hubs[loop] = Hub()
    found.start()
    return found


async def wait_for_entries(
    after: int, limit: int, run: int | None, kinds: Collection[str] | None, wait_s: float, *, looked: bool = True
) -> list[dict[str, Any]]:
    """Entries after ``after`` (as `feed.entries_after`) as soon as there are any, or [] when
    ``wait_s`` has passed. ``looked``: the caller has just read the feed after ``after`` and
    found nothing, so a position older than the listener's memory waits for a change before
    reading it again; a stream that has just sent a full batch has not looked, and reads on
    at once (a backlog drains a batch at a time, not a batch per change)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    listener = hub()
    first = looked
    while True:
        left = deadline - loop.time()
        if listener.ready and listener.covers(after):
            found = listener.after(after, limit, run, kinds)
            if found or left <= 0:
                return found
            pause = left
        else:
            if not first:
                found = await sync_to_async(read_feed, thread_sensitive=False, executor=executor())(
                    after, limit, run, kinds
                )
                if found:
                    return found
            if left <= 0:
                return []
            pause = min(left, FALLBACK_S)
        first = False
        changed = listener.changed
        async with step_aside():  # a parked wait leaves its turn to another request
            try:
                async with asyncio.timeout(pause):
                    await changed.wait()
            except TimeoutError:
                pass


def let_go_of_request_thread() -> None:
    """End the thread Django runs this ASGI request's synchronous parts on (its connection
    given back first, by the caller): a later synchronous part starts a new one."""
    context = SyncToAsync.thread_sensitive_context.get(None)
    if context is None or getattr(context, "_executor", None) is not None:
        return  # none, or the site's shared threads (cleanup.serving): nothing is held
    executor = SyncToAsync.context_to_thread_executor.pop(context, None)
    if executor is not None:
        executor.shutdown(wait=False)


def close_connection() -> None:
    """Give this thread's database connection back (closed, or to the pool)."""
    if not connection.in_atomic_block:
        connection.close()
