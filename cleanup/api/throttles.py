"""Rates and quotas: how much one user may ask of the API, answered 429 with ``Retry-After``.

`EventsThrottle` counts each user's requests in three scopes, each with its own rate from
the API settings' ``DEFAULT_THROTTLE_RATES`` (the site reads them from the environment):

- ``events_actions``: a person's actions, the POSTs that need ``cleanup.cleanup_run``
  (a cleanup, a waiver, a reconcile, marking a backend down or up), which each make work
  for the shards;
- ``events_writes``: every other POST (starting and cancelling runs);
- ``events_reads``: everything else.

A scope without a rate is not throttled. A throttled request answers 429, code
``throttled``; a start past ``EVENT_MAX_RUNNING_RUNS`` or ``EVENT_MAX_RUNNING_RUNS_PER_USER``
(`cleanup.runner.RunQuotaExceeded`) answers 429, code ``quota_exceeded``; both say in
``Retry-After`` when to try again.

The counts are kept in the cache named `CACHE` (``api_throttle``), else the default one.
The site puts it on Redis when ``REDIS_URL`` is set, so every process and machine counts
together; in a process's own memory otherwise, where each process counts apart. A cache that
fails (Redis down) lets the request through, logged: a throttle never takes the API down.
May import: Django and DRF only.
"""

import logging
from typing import Any

from django.core.cache import BaseCache, InvalidCacheBackendError, caches
from rest_framework.exceptions import APIException, Throttled
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

logger = logging.getLogger(__name__)

CACHE = "api_throttle"
ACTION_PERMISSION = "cleanup.cleanup_run"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class QuotaExceeded(Throttled):
    """429 ``quota_exceeded``: the request would pass a quota; ``wait`` is its Retry-After."""

    default_detail = "A quota is reached."
    default_code = "quota_exceeded"

    def __init__(self, detail: str | None = None, wait: float | None = None) -> None:
        APIException.__init__(self, detail, self.default_code)
        self.wait = wait


def counts() -> BaseCache:
    """The cache that holds the counts: `CACHE` when the site names one, else the default."""
    try:
        return caches[CACHE]
    except InvalidCacheBackendError:
        return caches["default"]


def scope_of(request: Request, view: APIView) -> str:
    """``events_reads``, ``events_writes`` or ``events_actions`` (a view may name its own)."""
    named: str | None = getattr(view, "throttle_scope", None)
    if named:
        return named
    if request.method in SAFE_METHODS:
        return "events_reads"
    needed = getattr(view, "required_perms", {}).get(request.method, ())
    return "events_actions" if ACTION_PERMISSION in needed else "events_writes"


class EventsThrottle(SimpleRateThrottle):
    """Each user's requests per scope (`scope_of`), at the rate the API settings give it now."""

    cache_format = "events-throttle:%(scope)s:%(ident)s"

    def __init__(self) -> None:
        # The rate depends on the request's scope: it is read in allow_request, at the
        # moment of use (so override_settings changes it), not here.
        pass

    def allow_request(self, request: Request, view: APIView) -> bool:
        self.scope = scope_of(request, view)
        self.rate = api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)  # type: ignore[assignment]  # a rate's text
        if not self.rate:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        self.cache = counts()
        try:
            return super().allow_request(request, view)
        except Exception:
            logger.warning("the API's throttle could not reach its cache; the request is let through", exc_info=True)
            return True

    def get_cache_key(self, request: Request, view: APIView) -> str:
        user = request.user
        ident = user.pk if user and user.is_authenticated else self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}


def document_throttles(
    result: dict[str, Any], generator: object, request: Request | None, public: bool
) -> dict[str, Any]:
    """drf-spectacular post-processing hook: 429 (throttled, or a quota) on every operation."""
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            error = responses.get("403") or responses.get("401")
            content = {"content": error["content"]} if error and "content" in error else {}
            quota = " or a quota is reached (quota_exceeded)" if method == "post" else ""
            responses.setdefault(
                "429",
                {
                    "description": f"Too many requests (throttled){quota}; Retry-After says when to try again.",
                    "headers": {"Retry-After": {"schema": {"type": "integer"}, "description": "seconds"}},
                    **content,
                },
            )
    return result
