"""The site-wide guards every request passes, as middleware the site lists in ``MIDDLEWARE``.

- `RefuseControlCharacterPaths`: a path with a NUL, another control character (C0, DEL,
  C1) or a lone surrogate in any segment is a 404 before any view or query sees it (a NUL
  reaching PostgreSQL is a 500; no URL of the site has such a character).
- `IdleSessionTimeout`: a signed-in session left without a request for longer than
  ``SESSION_IDLE_TIMEOUT`` seconds is logged out; ``SESSION_COOKIE_AGE`` bounds it overall.
- `NoStoreForApi`: every answer under ``/api/`` says ``Cache-Control: no-store``, so no
  browser or proxy keeps a copy of what the API showed.

May import: serving (and Django); nothing imports it but the ``MIDDLEWARE`` setting
and the app's start-up (`note_login`).
"""

import re
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.contrib.auth import logout
from django.contrib.sessions.backends.base import SessionBase
from django.http import Http404, HttpRequest, HttpResponseBase
from django.utils.cache import patch_cache_control
from django.utils.deprecation import MiddlewareMixin

from .serving import OnTheLoop, has_session_cookie

# C0 controls, DEL, C1 controls and the surrogates (a lone one cannot be encoded).
BAD_PATH_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")

# The session key that holds the time of a session's last request.
LAST_SEEN = "cleanup_last_seen"

View = TypeVar("View", bound=Callable[..., Any])


def path_problem(path: str) -> bool:
    """Whether ``path`` (decoded) has a character no URL of the site has."""
    return BAD_PATH_CHARACTER.search(path) is not None


class RefuseControlCharacterPaths(OnTheLoop, MiddlewareMixin):
    """A path with a control character or a lone surrogate answers 404 (the site's 404 page,
    JSON under ``/api/``)."""

    def process_request(self, request: HttpRequest) -> HttpResponseBase | None:
        if path_problem(request.path_info) or path_problem(request.path):
            raise Http404("no such page")
        return None


def note_login(sender: object, request: HttpRequest, user: object, **kwargs: object) -> None:
    """``user_logged_in``: a new session starts its idle clock at the login, so that its first
    pages need not save it again (wired by the app)."""
    session = getattr(request, "session", None)
    if session is not None:
        session[LAST_SEEN] = int(time.time())


def refreshes_itself(view: View) -> View:
    """Marks a view a page reads again by itself (the admin's live fragments): reading it is
    not a person's activity, so it does not hold an idle session open."""
    view.refreshes_itself = True  # type: ignore[attr-defined]  # a mark on the view function
    return view


class IdleSessionTimeout(OnTheLoop, MiddlewareMixin):
    """Logs out a session idle for longer than ``SESSION_IDLE_TIMEOUT`` seconds (0: never).

    Goes after the authentication middleware. Every request of an idle session logs it
    out; a request counts as activity unless its view `refreshes_itself`, so a live page
    left open does not keep its session alive. The time is written at most once a minute,
    so a busy page does not save its session on every request.
    """

    WRITE_EVERY_S = 60

    def needs_thread(self, hook: str, request: HttpRequest, other: object = None) -> bool:
        # The session, and the user it names, are read from the database only when the
        # request carries a session's cookie.
        return bool(getattr(settings, "SESSION_IDLE_TIMEOUT", 0)) and has_session_cookie(request)

    def _clock(self, request: HttpRequest) -> tuple[SessionBase, float | None, float] | None:
        """The session and its last activity, when the idle clock applies to this request."""
        if not has_session_cookie(request):
            return None  # no session to time, and no need to make the lazy user to know it
        timeout: float = getattr(settings, "SESSION_IDLE_TIMEOUT", 0)
        session: SessionBase | None = getattr(request, "session", None)
        user = getattr(request, "user", None)
        if not timeout or session is None or user is None or not user.is_authenticated:
            return None
        last = session.get(LAST_SEEN)
        return session, (last if isinstance(last, int | float) else None), timeout

    def process_request(self, request: HttpRequest) -> HttpResponseBase | None:
        clock = self._clock(request)
        if clock is not None:
            _session, last, timeout = clock
            if last is not None and time.time() - last > timeout:
                logout(request)
        return None

    def process_view(
        self,
        request: HttpRequest,
        view_func: Callable[..., object],
        view_args: tuple[object, ...],
        view_kwargs: dict[str, object],
    ) -> None:
        clock = self._clock(request)
        if clock is None or getattr(view_func, "refreshes_itself", False):
            return None
        session, last, _timeout = clock
        now = time.time()
        if last is None or now - last >= self.WRITE_EVERY_S:
            session[LAST_SEEN] = int(now)
        return None


class RateLimitHeaders(OnTheLoop, MiddlewareMixin):
    """``RateLimit-Limit``, ``-Remaining``, ``-Reset`` and ``-Policy`` on every answer whose
    request the API's throttle counted (it leaves ``(limit, remaining, reset, window)`` on
    the request as ``cleanup_rate_limit``): a console sees its standing before a 429."""

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        standing = getattr(request, "cleanup_rate_limit", None)
        if standing is not None:
            limit, remaining, reset, window = standing
            response["RateLimit-Limit"] = str(limit)
            response["RateLimit-Remaining"] = str(remaining)
            response["RateLimit-Reset"] = str(reset)
            response["RateLimit-Policy"] = f"{limit};w={window}"
        return response


class NoStoreForApi(OnTheLoop, MiddlewareMixin):
    """``Cache-Control: no-store`` (and ``private``) on every answer under ``/api/``."""

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        if request.path.startswith("/api/"):
            patch_cache_control(response, no_store=True, private=True)
        return response
