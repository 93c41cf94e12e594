"""Rates and quotas: how much one user may ask of the API, answered 429 with ``Retry-After``.

`EventsThrottle` counts each user's requests in three scopes, each with its own rate from
the API settings' ``DEFAULT_THROTTLE_RATES`` (the site reads them from the environment):

- ``events_actions``: a person's actions, the POSTs that need ``cleanup.cleanup_run``
  (a cleanup, a waiver, a reconcile, marking a backend down or up), which each make work
  for the shards;
- ``events_writes``: every other POST (starting and cancelling runs);
- ``events_reads``: everything else.

A scope without a rate is not throttled. Every answer to a request the throttle counted
(authenticated and permitted; 200s, 4xx and 429s alike) says where its user stands, in the
IETF draft's separate headers (draft-ietf-httpapi-ratelimit-headers up to -06, the form
most HTTP clients read): ``RateLimit-Limit`` (requests the scope allows per window),
``RateLimit-Remaining`` (left now), ``RateLimit-Reset`` (seconds until the oldest counted
request leaves the window, one more request allowed) and ``RateLimit-Policy``
(``1200;w=60``). The throttle notes them on the request (`RATE_LIMIT_ATTR`);
`cleanup.security.RateLimitHeaders` writes them, so the change feed's long polls carry them
too. A throttled request answers 429, code
``throttled``; a start past ``EVENT_MAX_RUNNING_RUNS`` or ``EVENT_MAX_RUNNING_RUNS_PER_USER``
(`cleanup.runner.RunQuotaExceeded`) answers 429, code ``quota_exceeded``; both say in
``Retry-After`` when to try again.

The counts are kept in the counters' cache every process of the site shares
(`cleanup.limits`: Redis when ``REDIS_URL`` is set, else the database), so three workers
count one user's rate together. A cache that fails (Redis down) lets the request through,
logged: a throttle never takes the API down.
May import: limits (and Django, DRF).
"""

import logging
import math
from typing import Any

from django.core.cache import BaseCache
from rest_framework.exceptions import APIException, Throttled
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

from .. import limits

logger = logging.getLogger(__name__)

CACHE = limits.COUNTERS_CACHE
ACTION_PERMISSION = "cleanup.cleanup_run"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# Where the throttle leaves (limit, remaining, reset seconds, window seconds) on the request.
RATE_LIMIT_ATTR = "cleanup_rate_limit"


class QuotaExceeded(Throttled):
    """429 ``quota_exceeded``: the request would pass a quota; ``wait`` is its Retry-After."""

    default_detail = "A quota is reached."
    default_code = "quota_exceeded"

    def __init__(self, detail: str | None = None, wait: float | None = None) -> None:
        APIException.__init__(self, detail, self.default_code)
        self.wait = wait


def counts() -> BaseCache:
    """The cache that holds the counts, the one every process shares (`cleanup.limits`)."""
    return limits.counters()


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
            allowed: bool = super().allow_request(request, view)
        except Exception:
            logger.warning("the API's throttle could not reach its cache; the request is let through", exc_info=True)
            return True
        self.note(request)
        return allowed

    def note(self, request: Request) -> None:
        """Leave the user's standing in this scope on the request, for the RateLimit-* headers."""
        history: list[float] = getattr(self, "history", [])
        now: float = getattr(self, "now", 0.0)
        limit, window = self.num_requests or 0, self.duration or 0
        remaining = max(0, limit - len(history))
        reset = math.ceil(window - (now - history[-1])) if history else 0
        standing = (limit, remaining, max(0, reset), window)
        setattr(request._request, RATE_LIMIT_ATTR, standing)

    def get_cache_key(self, request: Request, view: APIView) -> str:
        user = request.user
        ident = user.pk if user and user.is_authenticated else self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}


RATE_LIMIT_HEADERS: dict[str, Any] = {
    "RateLimit-Limit": {"schema": {"type": "integer"}, "description": "requests this scope allows per window"},
    "RateLimit-Remaining": {"schema": {"type": "integer"}, "description": "requests left in the window now"},
    "RateLimit-Reset": {
        "schema": {"type": "integer"},
        "description": "seconds until the oldest counted request leaves the window",
    },
    "RateLimit-Policy": {"schema": {"type": "string"}, "description": "the scope's rate: `LIMIT;w=SECONDS`"},
}


def document_throttles(
    result: dict[str, Any], generator: object, request: Request | None, public: bool
) -> dict[str, Any]:
    """drf-spectacular post-processing hook: 429 (throttled, or a quota) on every operation,
    and the RateLimit-* headers on its answers but 401 and 403."""
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            error = responses.get("403") or responses.get("401")
            content = {"content": error["content"]} if error and "content" in error else {}
            for code, response in responses.items():
                if str(code).startswith(("2", "4")) and code not in ("401", "403") and isinstance(response, dict):
                    response.setdefault("headers", {}).update(RATE_LIMIT_HEADERS)
            quota = " or a quota is reached (quota_exceeded)" if method == "post" else ""
            responses.setdefault(
                "429",
                {
                    "description": f"Too many requests (throttled){quota}; Retry-After says when to try again.",
                    "headers": {
                        "Retry-After": {"schema": {"type": "integer"}, "description": "seconds"},
                        **RATE_LIMIT_HEADERS,
                    },
                    **content,
                },
            )
    return result
