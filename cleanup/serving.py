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
marked with `own_threads` has its requests run on threads of its own (the change feed's).
May import: nothing of the app (Django, django-csp, asgiref).
"""

import functools
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any, TypeVar

from asgiref.sync import ThreadSensitiveContext, markcoroutinefunction, sync_to_async
from csp.middleware import CSPMiddleware as CSPMiddlewareBase
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware as AuthenticationMiddlewareBase
from django.contrib.messages.middleware import MessageMiddleware as MessageMiddlewareBase
from django.contrib.sessions.middleware import SessionMiddleware as SessionMiddlewareBase
from django.core.handlers import base as base_handler
from django.core.handlers.asgi import ASGIHandler as ASGIHandlerBase
from django.db import connections
from django.http import HttpRequest, HttpResponseBase
from django.middleware.clickjacking import XFrameOptionsMiddleware as XFrameOptionsMiddlewareBase
from django.middleware.common import CommonMiddleware as CommonMiddlewareBase
from django.middleware.csrf import CsrfViewMiddleware as CsrfViewMiddlewareBase
from django.middleware.security import SecurityMiddleware as SecurityMiddlewareBase
from django.urls import Resolver404, resolve
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


class MessageMiddleware(OnTheLoop, MessageMiddlewareBase):
    """Django's: messages are stored after the view only when some were added or read, in a
    cookie or the session; then that goes to the thread."""

    def needs_thread(self, hook: str, request: HttpRequest, other: object = None) -> bool:
        storage = getattr(request, "_messages", None)
        return hook == RESPONSE and storage is not None and bool(storage.used or storage.added_new)


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


def own_threads(threads: Callable[[], Executor]) -> Callable[[View], View]:
    """Marks a view whose requests' synchronous parts run on ``threads()`` (a process's
    `RequestThreads` of its own) instead of `request_threads()`: the change feed's, so
    that a thousand re-asks after a change do not queue before ``/healthz``."""

    def marked(view: View) -> View:
        view.serving_threads = threads  # type: ignore[attr-defined]  # a mark on the view function
        return view

    return marked


@functools.lru_cache(maxsize=4096)
def _threads_of_path(path: str) -> Callable[[], Executor]:
    try:
        view = resolve(path).func
    except Resolver404:
        return request_threads
    threads: Callable[[], Executor] = getattr(view, "serving_threads", request_threads)
    return threads


def threads_for(path: str) -> Executor:
    """The threads a request for ``path`` runs its synchronous parts on (`own_threads`)."""
    return _threads_of_path(path)()


class ASGIHandler(CounterpartChain, ASGIHandlerBase):
    """Django's ASGI handler, with the middleware of `COUNTERPARTS` on the event loop and each
    request's synchronous parts on `request_threads()` (or its view's `own_threads`)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        async with ThreadSensitiveContext(executor=threads_for(scope["path"])):
            await self.handle(scope, receive, send)
