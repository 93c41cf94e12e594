"""Conditional reads: a detail endpoint answers ``ETag``, and 304 to a current ``If-None-Match``.

The tag is a digest of the answer's JSON, so it changes exactly when what a console
would read changes (a step, a count, a live value), whatever field moved.
May import: Django and DRF only.
"""

import hashlib
from typing import TYPE_CHECKING, Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import status
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

IF_NONE_MATCH = OpenApiParameter(
    "If-None-Match",
    str,
    OpenApiParameter.HEADER,
    description="The ETag of the copy you hold: 304 with no body while it is still current.",
)
NOT_MODIFIED = OpenApiResponse(description="Not modified: the copy whose ETag was sent is current.")


def etag_of(data: object) -> str:
    return '"' + hashlib.sha256(JSONRenderer().render(data)).hexdigest()[:40] + '"'


def matches(header: str | None, tag: str) -> bool:
    """Does an ``If-None-Match`` header name ``tag`` (weak or strong), or ``*``?"""
    if not header:
        return False
    candidates = [part.strip() for part in header.split(",")]
    return "*" in candidates or any(c.removeprefix("W/") == tag for c in candidates)


def conditional(request: Request, response: Response) -> Response:
    """``response`` with its ETag, or a bodiless 304 when the request already holds it."""
    if response.status_code != status.HTTP_200_OK:
        return response
    tag = etag_of(response.data)
    if matches(request.META.get("HTTP_IF_NONE_MATCH"), tag):
        response = Response(status=status.HTTP_304_NOT_MODIFIED)
    response["ETag"] = tag
    return response


if TYPE_CHECKING:
    from rest_framework.mixins import RetrieveModelMixin as _Retrieve
else:
    _Retrieve = object


class ETagged(_Retrieve):
    """A retrieve view whose answer carries an ETag and honours ``If-None-Match``."""

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return conditional(request, super().retrieve(request, *args, **kwargs))
