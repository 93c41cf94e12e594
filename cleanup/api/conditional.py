"""Conditional requests: ``ETag`` on reads, 304 to a current ``If-None-Match``, 412 to a stale ``If-Match``.

A detail endpoint's tag is a digest of the answer's JSON, so it changes exactly when what a
console would read changes (a step, a count, a live value), whatever field moved. A list's
page answers a weak tag of what the page shows (its rows, and whether pages come before or
after it): its ``position`` moves with every change anywhere, so it is left out, and a 304
carries the current ``X-Feed-Position`` instead, the place the copy held is current at.

A write on a run or a row takes ``If-Match``: the tag of the run or the row as it was read.
It is compared with the object's tag now, just before the write; another answers 412
``precondition_failed`` with the current ``ETag``, and nothing is written.
May import: Django and DRF, and the API's errors.
"""

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import status
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from .errors import ApiError

IF_NONE_MATCH = OpenApiParameter(
    "If-None-Match",
    str,
    OpenApiParameter.HEADER,
    description="The ETag of the copy you hold: 304 with no body while it is still current.",
)
IF_MATCH = OpenApiParameter(
    "If-Match",
    str,
    OpenApiParameter.HEADER,
    description="The ETag of the run or row as you read it (GET answers it): the write is done only while "
    "it is still current, else 412 precondition_failed with the current ETag. `*`: any.",
)
NOT_MODIFIED = OpenApiResponse(description="Not modified: the copy whose ETag was sent is current.")
ETAG_HEADER = {"schema": {"type": "string"}, "description": "The answer's entity tag, for If-None-Match."}


def etag_of(data: object, weak: bool = False) -> str:
    tag = '"' + hashlib.sha256(JSONRenderer().render(data)).hexdigest()[:40] + '"'
    return "W/" + tag if weak else tag


def _candidates(header: str) -> list[str]:
    return [part.strip() for part in header.split(",") if part.strip()]


def matches(header: str | None, tag: str) -> bool:
    """Does an ``If-None-Match`` header name ``tag`` (weak comparison: W/ aside), or ``*``?"""
    if not header:
        return False
    candidates = _candidates(header)
    bare = tag.removeprefix("W/")
    return "*" in candidates or any(c.removeprefix("W/") == bare for c in candidates)


def conditional(request: Request, response: Response, weak: bool = False, shown: object = None) -> Response:
    """``response`` with its ETag (of ``shown``, else of its data), or a bodiless 304 when the
    request already holds it; the 304 keeps ``X-Feed-Position`` (a list's place in the feed)."""
    if response.status_code != status.HTTP_200_OK:
        return response
    tag = etag_of(response.data if shown is None else shown, weak)
    if matches(request.META.get("HTTP_IF_NONE_MATCH"), tag):
        not_modified = Response(status=status.HTTP_304_NOT_MODIFIED)
        for name in ("X-Feed-Position",):
            if name in response:
                not_modified[name] = response[name]
        response = not_modified
    response["ETag"] = tag
    return response


def check_if_match(request: Request, current: Callable[[], object], what: str) -> None:
    """Refuse the write (412) when ``If-Match`` names none of ``current()``'s tags.

    ``current`` answers the object as its GET does, read when a header is sent only; an
    If-Match compares strongly: a weak tag never matches.
    """
    header = request.META.get("HTTP_IF_MATCH")
    if header is None:
        return
    candidates = _candidates(header)
    if "*" in candidates:
        return
    tag = etag_of(current())
    if tag not in candidates:
        raise ApiError(
            status.HTTP_412_PRECONDITION_FAILED,
            "precondition_failed",
            f"{what} changed since it was read: If-Match names {header!r}, its ETag is now {tag}; "
            "read it again, then decide",
            headers={"ETag": tag},
        )


if TYPE_CHECKING:
    from rest_framework.mixins import RetrieveModelMixin as _Retrieve
else:
    _Retrieve = object


class ETagged(_Retrieve):
    """A retrieve view whose answer carries an ETag and honours ``If-None-Match``."""

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return conditional(request, super().retrieve(request, *args, **kwargs))
