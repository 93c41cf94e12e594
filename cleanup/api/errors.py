"""Every error under ``/api/`` is JSON ``{"detail": ...}`` (or field messages), whatever ``DEBUG`` is.

Three places answer errors, and each is made to speak JSON here:

- `exception_handler`, DRF's hook, for what a view raises: a 404 has one wording on every
  endpoint, and a body past ``DATA_UPLOAD_MAX_MEMORY_SIZE`` is 413;
- `ApiErrorsMiddleware`, for what happens outside the views: a path no endpoint matches
  (Django answers it with an HTML page, a technical one under ``DEBUG``), a body too
  large to read at all, and anything else that would answer HTML;
- `cleanup.api.parsers.BoundedJSONParser`, which reads at most the allowed body and
  refuses, naming the field, JSON that PostgreSQL could not store.
May import: Django and DRF only.
"""

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import Http404, JsonResponse
from rest_framework import status
from rest_framework.exceptions import APIException, NotFound

NOT_FOUND = "Not found."
API_PREFIX = "/api/"


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


def body_limit():
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def exception_handler(exc, context):
    # Imported here: rest_framework.views reads the API settings, which name this module.
    from rest_framework.views import exception_handler as drf_exception_handler

    if isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge()
    elif isinstance(exc, Http404 | NotFound):
        exc = NotFound(NOT_FOUND)
    return drf_exception_handler(exc, context)


def _too_large(request):
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return False
    limit = body_limit()
    return limit is not None and length > limit


GENERIC = {
    400: "Bad request.",
    403: "Forbidden.",
    404: NOT_FOUND,
    405: "Method not allowed.",
    413: PayloadTooLarge.default_detail,
    500: "Server error.",
}


class ApiErrorsMiddleware:
    """Under ``/api/``, an error response that is not JSON is replaced by one that is."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        if _too_large(request):
            # Refused before anything reads the body (a form body is read by the CSRF check).
            return JsonResponse({"detail": PayloadTooLarge.default_detail}, status=413)
        response = self.get_response(request)
        if response.status_code >= 400 and not response.get("Content-Type", "").startswith("application/json"):
            code = response.status_code
            detail = GENERIC.get(code) or response.reason_phrase or "Error."
            json_response = JsonResponse({"detail": detail}, status=code)
            if "Allow" in response:
                json_response["Allow"] = response["Allow"]
            return json_response
        return response
