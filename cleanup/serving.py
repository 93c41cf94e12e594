"""Middleware that runs on the event loop under ASGI, and goes to a thread only to reach the database.

Django's own middleware (`django.utils.deprecation.MiddlewareMixin`) runs each hook on the
request's thread when the site is served by ASGI: a request through Django's nine is
about twenty hand-overs between the event loop and a thread, and the first starts a
thread. For a change feed's long poll that is most of what a re-ask costs. Yet most hooks
only read and write headers and attributes: `OnTheLoop` runs a hook on the loop unless
`needs_thread` says this call may touch the database (a session to save, messages to
store in the session, a session to read), and then on the request's thread, as Django
would. Served by WSGI (runserver, the test client) nothing changes.

The classes below are Django's and django-csp's middleware with that mixin. The site lists
the originals in ``MIDDLEWARE`` (where Django's own checks look for them); `ASGIHandler`
builds its chain with these in their place (`COUNTERPARTS`). A hook whose condition is wrong here
would touch the database from the event loop, which Django refuses with
``SynchronousOnlyOperation``; the tests run every kind of request through ASGI for that.

`ASGIHandler` is Django's, with the threads a request's synchronous parts run on taken
from the process's `RequestThreads` (``ASGI_THREADS``, 8), instead of a thread started
for each request and a second one started to join it when the request ends. Starting a
thread waits for the new thread to run, which, while other threads hold the interpreter,
stalls the event loop: a thousand re-asks after a change started two thousand threads.
Django runs a request's synchronous parts on one thread so that they share its database
connection; here each part gives back the connection it opened when it ends (unless a
transaction is open), so any of the threads serves the next part. The threads also bound
how many synchronous views a process runs at once, as a WSGI worker's threads do. A view
marked with `own_threads` has its requests run on threads of its own (the change feed's),
and, when it says how many, taking turns on the event loop (`Turn`).

`settle_the_heap` readies a worker's heap once the site is loaded: what start-up made is
kept out of the garbage collector's passes, which then come less often (``ASGI_GC_THRESHOLD``).
May import: nothing of the app (Django, django-csp, django-axes, asgiref).
"""

import asyncio
import contextlib
import contextvars
import functools
import gc
import threading
import weakref
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, TypeVar

from asgiref.sync import ThreadSensitiveContext, iscoroutinefunction, markcoroutinefunction, sync_to_async
from csp.middleware import CSPMiddleware as CSPMiddlewareBase
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware as AuthenticationMiddlewareBase
from django.contrib.messages.middleware import MessageMiddleware as MessageMiddlewareBase
from django.contrib.messages.storage import default_storage
from django.contrib.sessions.middleware import SessionMiddleware as SessionMiddlewareBase
from django.core.handlers import base as base_handler
from django.core.handlers.asgi import ASGIHandler as ASGIHandlerBase
from django.db import connections
from django.http import HttpRequest, HttpResponseBase
from django.middleware.clickjacking import XFrameOptionsMiddleware as XFrameOptionsMiddlewareBase
from django.middleware.common import CommonMiddleware as CommonMiddlewareBase
from django.middleware.csrf import CsrfViewMiddleware as CsrfViewMiddlewareBase
from django.middleware.security import SecurityMiddleware as SecurityMiddlewareBase
from django.urls import Resolver404, get_resolver, resolve
from django.utils.functional import SimpleLazyObject, empty
from django.utils.module_loading import import_string

REQUEST, VIEW, RESPONSE = "request", "view", "response"
View = TypeVar("View", bound=Callable[..., Any])


def has_session_cookie(request: HttpRequest) -> bool:
    """Whether reading this request's session (or its user) may read the database."""
    return settings.SESSION_COOKIE_NAME in request.COOKIES


class OnTheLoop:
    """For a `MiddlewareMixin` subclass (listed before it): under ASGI its hooks run on the
    event loop, each call for which `needs_thread` answers True on the request's thread."""

    async_mode: bool
    get_response: Callable[[HttpRequest], Any]

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        super().__init__(get_response)  # type: ignore[call-arg]
        view_hook = getattr(self, "process_view", None)
        if self.async_mode and view_hook is not None:
            # Django awaits a coroutine function as it is, where it would wrap a plain one
            # in a thread; the instance's attribute is what it reads.
            self.process_view = self._view_on_the_loop(view_hook)

    def needs_thread(self, hook: str, request: HttpRequest, other: object = None) -> bool:
        """Whether this call of ``hook`` (`REQUEST`, `VIEW`, `RESPONSE`) may touch the database;
        ``other`` is the view function for `VIEW`, the response for `RESPONSE`."""
        return False

    def _view_on_the_loop(self, hook: Callable[..., Any]) -> Callable[..., Any]:
        async def process_view(request: HttpRequest, *args: Any) -> Any:
            if self.needs_thread(VIEW, request, args[0] if args else None):
                return await sync_to_async(hook, thread_sensitive=True)(request, *args)
            return hook(request, *args)

        return markcoroutinefunction(process_view)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        response = None
        before = getattr(self, "process_request", None)
        if before is not None:
            if self.needs_thread(REQUEST, request):
                response = await sync_to_async(before, thread_sensitive=True)(request)
            else:
                response = before(request)
        if response is None:
            response = await self.get_response(request)
        after = getattr(self, "process_response", None)
        if after is not None:
            if self.needs_thread(RESPONSE, request, response):
                response = await sync_to_async(after, thread_sensitive=True)(request, response)
            else:
                response = after(request, response)
        answered: HttpResponseBase = response
        return answered


class SecurityMiddleware(OnTheLoop, SecurityMiddlewareBase):
    """Django's: a redirect to HTTPS and security headers, nothing stored."""


class CSPMiddleware(OnTheLoop, CSPMiddlewareBase):  # type: ignore[misc]  # django-csp's types are partial
    """django-csp's: a nonce and a header, nothing stored."""


class CommonMiddleware(OnTheLoop, CommonMiddlewareBase):
    """Django's: a host check and the trailing slash's redirect, against the URLconf."""


class XFrameOptionsMiddleware(OnTheLoop, XFrameOptionsMiddlewareBase):
    """Django's: one header."""


class AuthenticationMiddleware(OnTheLoop, AuthenticationMiddlewareBase):
    """Django's: sets a lazy ``request.user``, read (from the session) only when used."""


class CsrfViewMiddleware(OnTheLoop, CsrfViewMiddlewareBase):
    """Django's: the secret is a cookie, unless ``CSRF_USE_SESSIONS`` keeps it in the session."""

    def needs_thread(self, hook: str, request: HttpRequest, other: object = None) -> bool:
        return bool(settings.CSRF_USE_SESSIONS) and has_session_cookie(request)


class SessionMiddleware(OnTheLoop, SessionMiddlewareBase):
    """Django's: the session is read when used, and saved after the view when it changed
    (or on every request, ``SESSION_SAVE_EVERY_REQUEST``): that save goes to the thread."""

    def needs_thread(self, hook: str, request: HttpRequest, other: object = None) -> bool:
        if hook != RESPONSE:
            return False
        session = getattr(request, "session", None)
        if session is None:
            return False
        return bool(session.modified or settings.SESSION_SAVE_EVERY_REQUEST) and not session.is_empty()


def made(lazy: object) -> bool:
    """Whether a `SimpleLazyObject` was used (so made); anything else counts as made."""
    return not isinstance(lazy, SimpleLazyObject) or lazy._wrapped is not empty


class MessageMiddleware(OnTheLoop, MessageMiddlewareBase):
    """Django's, with the request's message storage made when first used: most requests (the
    API's, ``/healthz``) never use it, and making one signs nothing then. Messages are stored
    after the view only when some were added or read, in a cookie or the session; then that
    goes to the thread."""

    def process_request(self, request: HttpRequest) -> None:
        # What Django's makes at once, made when used.
        request._messages = SimpleLazyObject(lambda: default_storage(request))  # type: ignore[attr-defined]

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        if not made(getattr(request, "_messages", None)):
            return response
        answered: HttpResponseBase = super().process_response(request, response)
        return answered

    def needs_thread(self, hook: str, request: HttpRequest, other: object = None) -> bool:
        storage = getattr(request, "_messages", None)
        if hook != RESPONSE or storage is None or not made(storage):
            return False
        return bool(storage.used or storage.added_new)


class AxesMiddleware:
    """django-axes' (it answers a locked-out login), deciding once, when the chain is built,
    whether it serves the loop (django-axes' asks ``inspect`` on every call), and under
    ASGI answering a lockout as under WSGI (django-axes' async path leaves the response out
    of its lockout handler's arguments). django-axes is imported only to answer a lockout:
    a project may list the app's middleware without it."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)

    @staticmethod
    def locked_out(request: HttpRequest) -> bool:
        return bool(settings.AXES_ENABLED) and bool(getattr(request, "axes_locked_out", None))

    @staticmethod
    def lockout_response(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        from axes.helpers import get_lockout_response

        answered: HttpResponseBase = get_lockout_response(request, response, getattr(request, "axes_credentials", None))
        return answered

    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self.__acall__(request)
        response = self.get_response(request)
        return self.lockout_response(request, response) if self.locked_out(request) else response

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        response: HttpResponseBase = await self.get_response(request)
        if self.locked_out(request):
            response = await sync_to_async(self.lockout_response, thread_sensitive=True)(request, response)
        return response


def give_back_connections() -> None:
    """Close (give back to the pool) every database connection this thread holds, unless a
    transaction holds it."""
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close()


class RequestThreads(ThreadPoolExecutor):
    """The process's threads for requests' synchronous parts under ASGI (see the module's
    text): each part runs on any of them and gives back its connections when it ends."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        return super().submit(self._giving_back, fn, *args, **kwargs)

    @staticmethod
    def _giving_back(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            give_back_connections()


_threads: RequestThreads | None = None
_threads_lock = threading.Lock()


def request_threads() -> RequestThreads:
    """The process's `RequestThreads`, made on first use (in the worker, after a fork)."""
    global _threads
    with _threads_lock:
        if _threads is None:
            count = int(getattr(settings, "ASGI_THREADS", 8))
            _threads = RequestThreads(max_workers=count, thread_name_prefix="request")
        return _threads


# What `ASGIHandler` serves in place of each of Django's and django-csp's middleware.
COUNTERPARTS: dict[str, type] = {
    "django.middleware.security.SecurityMiddleware": SecurityMiddleware,
    "csp.middleware.CSPMiddleware": CSPMiddleware,
    "django.contrib.sessions.middleware.SessionMiddleware": SessionMiddleware,
    "django.middleware.common.CommonMiddleware": CommonMiddleware,
    "django.middleware.csrf.CsrfViewMiddleware": CsrfViewMiddleware,
    "django.contrib.auth.middleware.AuthenticationMiddleware": AuthenticationMiddleware,
    "django.contrib.messages.middleware.MessageMiddleware": MessageMiddleware,
    "django.middleware.clickjacking.XFrameOptionsMiddleware": XFrameOptionsMiddleware,
    "axes.middleware.AxesMiddleware": AxesMiddleware,
}


class CounterpartChain:
    """For a Django handler (listed before it): its middleware chain is built with each of
    `COUNTERPARTS` in place of the original the site lists."""

    def load_middleware(self, is_async: bool = False) -> None:
        # Django's handler imports each listed path as it builds the chain; here a listed
        # original is imported as its counterpart (at start-up, before any request).
        def counterpart_of(path: str) -> Any:
            return COUNTERPARTS.get(path) or import_string(path)

        original = base_handler.import_string
        base_handler.import_string = counterpart_of  # type: ignore[assignment]
        try:
            super().load_middleware(is_async)  # type: ignore[misc]
        finally:
            base_handler.import_string = original  # type: ignore[assignment]


class Turn:
    """A request's turn on the event loop, among the requests of a view that takes turns
    (`own_threads` with ``turns``): at most that many of them are served at once in a
    process; the others wait, in the order they came, for one of those to end or to
    `step_aside`. A thousand long polls woken by one change then answer a few at a time,
    and the loop goes back to its sockets between (a ``/healthz`` that came meanwhile is
    served then, not after the thousand)."""

    _turns: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, asyncio.Semaphore]]" = (
        weakref.WeakKeyDictionary()
    )

    def __init__(self, turns: int) -> None:
        kept = self._turns.setdefault(asyncio.get_running_loop(), {})
        if turns not in kept:
            kept[turns] = asyncio.Semaphore(turns)
        self.turns = kept[turns]
        self.held = False

    async def take(self) -> None:
        await self.turns.acquire()
        self.held = True

    def give(self) -> None:
        if self.held:
            self.held = False
            self.turns.release()


_turn: contextvars.ContextVar[Turn | None] = contextvars.ContextVar("cleanup_turn", default=None)


@contextlib.asynccontextmanager
async def turn_taken(turns: int) -> AsyncIterator[Turn]:
    """Serves what it wraps (a request) in its `Turn` among ``turns``: waits for one, and
    gives it back at the end (unless given already) however it ends."""
    turn = Turn(turns)
    held = _turn.set(turn)  # this request's context (the tasks it starts copy it)
    try:
        await turn.take()
        yield turn
    finally:
        turn.give()
        _turn.reset(held)


@contextlib.asynccontextmanager
async def step_aside() -> AsyncIterator[None]:
    """While this request waits (parked until a change), it leaves its `Turn` to the next
    request, and takes one again after (not when the wait ends by an error: the request is
    ending). A request that holds no turn (it takes none, or left it) just waits."""
    turn = _turn.get()
    if turn is None or not turn.held:
        yield
        return
    turn.give()
    yield
    await turn.take()


def leave_turn() -> None:
    """This request needs no more turns (an event stream, from its first event on): it
    gives back the one it holds, for good."""
    turn = _turn.get()
    if turn is not None:
        turn.give()


def own_threads(threads: Callable[[], Executor], turns: int | None = None) -> Callable[[View], View]:
    """Marks a view whose requests' synchronous parts run on ``threads()`` (a process's
    `RequestThreads` of its own) instead of `request_threads()`: the change feed's, so
    that a thousand re-asks after a change do not queue before ``/healthz``. With
    ``turns``, its requests are served that many at a time (`Turn`)."""

    def marked(view: View) -> View:
        view.serving_threads = threads  # type: ignore[attr-defined]  # a mark on the view function
        view.serving_turns = turns  # type: ignore[attr-defined]
        return view

    return marked


@functools.lru_cache(maxsize=4096)
def _serving_of_path(path: str) -> tuple[Callable[[], Executor], int | None]:
    try:
        view = resolve(path).func
    except Resolver404:
        return request_threads, None
    return getattr(view, "serving_threads", request_threads), getattr(view, "serving_turns", None)


def threads_for(path: str) -> Executor:
    """The threads a request for ``path`` runs its synchronous parts on (`own_threads`)."""
    return _serving_of_path(path)[0]()


def turns_for(path: str) -> int | None:
    """How many requests for ``path``'s view a process serves at once (None: no limit)."""
    return _serving_of_path(path)[1]


def settle_the_heap(threshold: int) -> None:
    """Once a worker has loaded the site (its URLconf, so every view): collect, then keep all
    that is left out of the garbage collector's passes (it lives as long as the process),
    and make the youngest generation ``threshold`` allocations long (Python's is 700), so
    that the collector neither runs every few requests nor walks the whole site when it
    does, a pause during which the event loop serves no one. 0 leaves the collector as it is."""
    if threshold <= 0:
        return
    get_resolver().url_patterns  # noqa: B018  (imports every view)
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(threshold, middle, old)


class ASGIHandler(CounterpartChain, ASGIHandlerBase):
    """Django's ASGI handler, with the middleware of `COUNTERPARTS` on the event loop and each
    request's synchronous parts on `request_threads()` (or its view's `own_threads`, taking
    its `Turn` when the view says how many)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        path = scope["path"]
        async with ThreadSensitiveContext(executor=threads_for(path)):
            turns = turns_for(path)
            if turns is None:
                await self.handle(scope, receive, send)
                return
            async with turn_taken(turns):
                await self.handle(scope, receive, send)
