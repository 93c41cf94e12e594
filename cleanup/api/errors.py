"""Every error under ``/api/`` is one JSON envelope with a stable code, whatever ``DEBUG`` is.

The envelope is ``{"code": "...", "detail": "...", "errors": {field: [messages]}?}``:
``code`` is one of `CODES` (a console branches on it; docs/api.md lists them), ``detail``
is a sentence for a person, and ``errors`` names each bad field of a 400.

A view that refuses something raises `ApiError` (or one of its named subclasses) with a
status, a code and a detail; DRF's own exceptions get their code here too. Three places
answer errors, and each answers the envelope:

- `exception_handler`, DRF's hook, for what a view raises: a 404 has one wording on every
  endpoint, and a body past ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is 413;
- `ApiErrorsMiddleware`, for what happens outside the views: a path no endpoint matches
  (Django answers it with an HTML page, a technical one under ``DEBUG``), a body too
  large to read at all, and anything else that would answer HTML; it also says, on every
  answer under the old ``/api/events/``, that ``/api/v1/events/`` succeeds it;
- `cleanup.api.parsers.BoundedJSONParser`, which reads at most the allowed body and
  refuses, naming the field, JSON that PostgreSQL could not store.
May import: Django and DRF only.
"""

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.exceptions import DisallowedHost, PermissionDenied, RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponseBase, JsonResponse
from rest_framework import exceptions, status
from rest_framework.exceptions import APIException
from rest_framework.response import Response

# What a field's messages are keyed by: ``{"steps[0].action": ["unknown action"]}``.
FieldErrors = dict[str, list[str]]

API_PREFIX = "/api/"
# The versioned API, and the old prefix that keeps answering the same until it is removed.
V1_PREFIX = "/api/v1/events/"
LEGACY_PREFIX = "/api/events/"
# When the old prefix was deprecated (RFC 9745: "@" and Unix seconds): 2026-12-01T00:00:00Z.
DEPRECATED_SINCE = 1796083200

NOT_FOUND = "Not found."

# Every code an error under the API can carry: its status and what it means. The schema's
# enum of `Error.code`, each operation's error responses and the table in docs/api.md are
# all this table.
CODES = {
    "invalid": (400, "A field of the body, or a query parameter's value, is not valid; `errors` names each."),
    "parse_error": (400, "The body is not JSON (or not in the declared charset)."),
    "unknown_parameter": (400, "A query parameter the endpoint does not take; `errors` names it."),
    "not_authenticated": (
        401,
        "No credentials, or credentials that are not valid (an unknown token, an inactive user).",
    ),
    "permission_denied": (403, "Not staff, or without the endpoint's permission."),
    "not_found": (404, "No such run, row or module, or no endpoint at this path."),
    "method_not_allowed": (405, "A method the endpoint does not have (`Allow` lists those it has)."),
    "not_acceptable": (406, "The `Accept` header asks for something other than JSON."),
    "conflict": (409, "The state does not allow this (a conflict no more precise code names)."),
    "run_in_flight": (409, "A cleanup asked of a run still running."),
    "run_ended": (409, "A cancel of a run that has already ended."),
    "nothing_to_clean": (409, "A cleanup asked of a run that owes nothing."),
    "already_resolved": (409, "A waiver of a row already resolved, or held by a sweeper right now."),
    "already_down": (409, "A backend marked down that is down already."),
    "already_up": (409, "A backend marked up that is up already (or was never seen)."),
    "walk_not_exact": (
        409,
        "A page of a walk by `updated_at` asked after rows of the list changed since the walk began; "
        "walk by `id` or `-id` (exact), or start again.",
    ),
    "idempotency_key_in_use": (
        409,
        "A request with this `Idempotency-Key` is still being worked on; `Retry-After` says when to retry.",
    ),
    "precondition_failed": (
        412,
        "An `If-Match` that is not the run's or row's current `ETag`: it changed since it was read; nothing "
        "was written.",
    ),
    "payload_too_large": (413, "A body over `DATA_UPLOAD_MAX_MEMORY_SIZE`."),
    "unsupported_media_type": (415, "A body that is not `application/json`."),
    "idempotency_key_reused": (422, "An `Idempotency-Key` sent again with another body."),
    "throttled": (429, "Too many requests; `Retry-After` says when to try again."),
    "quota_exceeded": (
        429,
        "Too many runs running, for the site or for this user; `Retry-After` says when to try again.",
    ),
    "server_error": (500, "Something went wrong on the server; nothing is said of what."),
}
# For the schema's enum (SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"]).
CODE_CHOICES = [(code, code) for code in CODES]


def codes_of(status_code: int) -> list[str]:
    """The codes an error of ``status_code`` can carry."""
    return [code for code, (status_of, _) in CODES.items() if status_of == status_code]


# The code of an error no one named, by its status.
CODE_OF_STATUS = {
    400: "invalid",
    401: "not_authenticated",
    403: "permission_denied",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    412: "precondition_failed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "throttled",
    500: "server_error",
}

# The sentence of an error answered outside the views, by its status.
GENERIC = {
    400: "Bad request.",
    401: "Authentication credentials were not provided or are not valid.",
    403: "You do not have permission to perform this action.",
    404: NOT_FOUND,
    405: "Method not allowed.",
    406: "Only JSON is answered here.",
    412: "The object changed since it was read.",
    413: "The request body is too large.",
    415: "The body must be JSON (Content-Type: application/json).",
    429: "Too many requests.",
    500: "Server error.",
}


class ApiError(APIException):
    """An error answered as the envelope: ``raise ApiError(409, "run_ended", "run 7 is already completed")``.

    ``code`` must be one of `CODES`, of that status; ``errors`` (``{field: [messages]}``) names bad fields;
    ``headers`` (such as ``{"Retry-After": "30"}``) are added to the answer.
    """

    def __init__(
        self,
        status_code: int,
        code: str,
        detail: str,
        *,
        errors: FieldErrors | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if code not in CODES:
            raise ValueError(f"{code!r} is not one of the API's error codes (cleanup.api.errors.CODES)")
        if CODES[code][0] != status_code:
            raise ValueError(f"{code!r} is a {CODES[code][0]}, not a {status_code} (cleanup.api.errors.CODES)")
        self.status_code = status_code
        self.code = code
        self.errors = errors
        self.headers = dict(headers or {})
        super().__init__(detail, code)


class Conflict(ApiError):
    """409: the state does not allow it; ``code`` says which conflict."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(status.HTTP_409_CONFLICT, code, detail)


class Invalid(ApiError):
    """400 ``invalid``, naming each bad field (or query parameter) with its messages."""

    def __init__(self, errors: Mapping[str, Iterable[str]], detail: str | None = None) -> None:
        listed = {field: list(messages) for field, messages in errors.items()}
        super().__init__(status.HTTP_400_BAD_REQUEST, "invalid", detail or summary(listed), errors=listed)


class UnknownParameter(ApiError):
    """400 ``unknown_parameter``, naming each query parameter the endpoint does not take."""

    def __init__(self, names: Iterable[str], allowed: Iterable[str]) -> None:
        allowed_text = ", ".join(sorted(allowed)) or "none"
        message = f"unknown query parameter; this endpoint takes: {allowed_text}"
        errors = {name: [message] for name in sorted(names)}
        detail = f"unknown query parameter{'s' if len(errors) > 1 else ''}: {', '.join(errors)}"
        super().__init__(status.HTTP_400_BAD_REQUEST, "unknown_parameter", detail, errors=errors)


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = GENERIC[413]
    default_code = "payload_too_large"


def summary(errors: Mapping[str, Iterable[object]]) -> str:
    """One sentence of field messages: ``steps[1].action: unknown action; name: required``."""
    return "; ".join(f"{field}: {' '.join(str(m) for m in messages)}" for field, messages in errors.items())


def envelope(code: str, detail: object, errors: FieldErrors | None = None) -> dict[str, object]:
    body: dict[str, object] = {"code": code, "detail": str(detail)}
    if errors:
        body["errors"] = errors
    return body


def _flatten(data: object, prefix: str = "") -> FieldErrors:
    """DRF's nested ``ValidationError.detail`` as ``{"field": [messages]}`` (``steps[0].action``)."""
    found: FieldErrors
    if isinstance(data, dict):
        found = {}
        for key, value in data.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            found.update(_flatten(value, name))
        return found
    if isinstance(data, list) and data and all(isinstance(item, str) for item in data):
        return {prefix or "non_field_errors": [str(item) for item in data]}
    if isinstance(data, list):
        found = {}
        for index, item in enumerate(data):
            if item:
                found.update(_flatten(item, f"{prefix}[{index}]"))
        return found
    return {prefix or "non_field_errors": [str(data)]}


def _code_of(exc: Exception, status_code: int) -> str:
    if isinstance(exc, ApiError):
        return exc.code
    if isinstance(exc, exceptions.ParseError):
        return "parse_error"
    if isinstance(exc, exceptions.AuthenticationFailed | exceptions.NotAuthenticated):
        return "not_authenticated"
    own = getattr(exc, "default_code", None)
    if isinstance(exc, APIException) and isinstance(own, str) and own in CODES:
        if not isinstance(exc, exceptions.ValidationError):
            return own
    return CODE_OF_STATUS.get(status_code, "invalid" if status_code < 500 else "server_error")


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    # Imported here: rest_framework.views reads the API settings, which name this module.
    from rest_framework.views import exception_handler as drf_exception_handler

    if isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge()
    elif isinstance(exc, Http404 | exceptions.NotFound):
        exc = exceptions.NotFound(NOT_FOUND)
    elif isinstance(exc, PermissionDenied):
        # Django's own refusal (DRF answers it 403 too) carries no ``detail``: DRF's does.
        exc = exceptions.PermissionDenied(*exc.args)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    code = _code_of(exc, response.status_code)
    errors: FieldErrors | None = getattr(exc, "errors", None)
    detail: object
    if isinstance(exc, exceptions.ValidationError):
        errors = _flatten(exc.detail)
        detail = summary(errors)
    elif isinstance(exc, APIException) and isinstance(exc.detail, dict | list):
        errors = errors or _flatten(exc.detail)
        detail = summary(errors)
    else:
        assert isinstance(exc, APIException)  # DRF answers nothing else
        detail = exc.detail
    response.data = envelope(code, detail, errors)
    for name, value in getattr(exc, "headers", {}).items():
        response[name] = value
    return response


def error_response(
    status_code: int, code: str | None = None, detail: str | None = None, errors: FieldErrors | None = None
) -> JsonResponse:
    """The envelope as a plain Django answer, for errors answered outside DRF's views."""
    code = code or CODE_OF_STATUS.get(status_code, "invalid" if status_code < 500 else "server_error")
    return JsonResponse(envelope(code, detail or GENERIC.get(status_code, "Error."), errors), status=status_code)


def _too_large(request: HttpRequest) -> bool:
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return False
    limit = body_limit()
    return limit is not None and length > limit


def body_limit() -> int | None:
    limit: int | None = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return limit


def successor_url(request: HttpRequest) -> str:
    """The same request's URL under ``/api/v1/events/``."""
    path = V1_PREFIX + request.path[len(LEGACY_PREFIX) :]
    query = request.META.get("QUERY_STRING", "")
    return request.build_absolute_uri(path + (f"?{query}" if query else ""))


def mark_deprecated(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
    """An answer under the old ``/api/events/`` says it is deprecated, and where its successor is."""
    try:
        successor = successor_url(request)
    except DisallowedHost:
        # A host Django refuses (its answer is a 400) still learns where the successor is.
        successor = V1_PREFIX + request.path[len(LEGACY_PREFIX) :]
    response["Deprecation"] = f"@{DEPRECATED_SINCE}"
    response["Link"] = f'<{successor}>; rel="successor-version"'
    return response


class ApiErrorsMiddleware:
    """Under ``/api/``, an error response that is not the envelope is replaced by one that is."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self.__acall__(request)
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        # Refused before anything reads the body (a form body is read by the CSRF check).
        response = error_response(413) if _too_large(request) else self.get_response(request)
        return self.enveloped(request, response)

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        if not request.path.startswith(API_PREFIX):
            answer: HttpResponseBase = await self.get_response(request)
            return answer
        response = error_response(413) if _too_large(request) else await self.get_response(request)
        return self.enveloped(request, response)

    def enveloped(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        if response.status_code >= 400 and not response.get("Content-Type", "").startswith("application/json"):
            replaced = error_response(response.status_code, detail=GENERIC.get(response.status_code))
            for header in ("Allow", "Retry-After", "WWW-Authenticate"):
                if header in response:
                    replaced[header] = response[header]
            response = replaced
        if request.path.startswith(LEGACY_PREFIX):
            mark_deprecated(request, response)
        return response
