"""`GET changes/`: the change feed, read or waited on; and `position`, where it stands now.

A console reads what happened after the highest id it has seen (`?after=`), and with
``?wait=`` (up to 30 s) waits for it: the view asks the database in short queries, a
moment apart, and closes its connection between them, so a waiting console holds no
connection. The feed itself, one sequence over the run log and the modules' log, is
`cleanup.feed`.
May import: the models, `feed`, the API's own modules.
"""

import time
from typing import Any

from django.http import QueryDict
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import feed
from ..models import LogKind, ModuleEventKind
from .views import MAX_ID, EventsAPI, errors

MAX_WAIT_S = 30
DEFAULT_LIMIT = 100
MAX_LIMIT = 500
# How long a waiting request sleeps between two looks at the feed.
POLL_S = 0.25


def position() -> int:
    """The highest id in the change feed now; what happens from now on is listed after it."""
    return feed.position()


class ChangeSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField(help_text="Its place in the feed: ask for `?after=` the highest id read.")
    at = serializers.DateTimeField()
    kind = serializers.ChoiceField(choices=[*LogKind.values, *ModuleEventKind.values])
    # A field named as `Field.source`: DRF takes declared fields off the class, the stubs cannot say so.
    source = serializers.ChoiceField(choices=feed.FEED_KINDS, help_text="The run log or the modules' log.")  # type: ignore[assignment]
    run = serializers.IntegerField(allow_null=True, help_text="The run of a run log entry; null for a module's.")
    module = serializers.CharField(allow_null=True)
    backend = serializers.CharField(allow_null=True)
    detail = serializers.JSONField()


def whole_number(params: QueryDict, name: str, default: int, low: int, high: int) -> int:
    value = params.get(name)
    if value is None:
        return default
    if not (value.isascii() and value.isdecimal()) or not low <= int(value) <= high:
        raise ValidationError({name: [f"a whole number from {low} to {high}, got {value!r}"]})
    return int(value)


def pause(seconds: float) -> None:
    """Sleep between two looks at the feed (a test replaces it to watch the connection)."""
    time.sleep(seconds)


# The clock a wait is measured on (a test moves it on with `pause`).
clock = time.monotonic


@extend_schema(
    tags=["changes"],
    summary="What happened, in order: the run log and the modules' log in one sequence",
    parameters=[
        OpenApiParameter(
            "after",
            {"type": "integer", "minimum": 0, "maximum": MAX_ID},
            description="Only entries placed after this id (default 0: from the start).",
        ),
        OpenApiParameter(
            "limit",
            {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT},
            description=f"At most this many entries (default {DEFAULT_LIMIT}).",
        ),
        OpenApiParameter(
            "wait",
            {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_S},
            description="With nothing after `after`, wait up to this many seconds for something to happen; "
            "[] when nothing did.",
        ),
    ],
    responses={
        200: OpenApiResponse(ChangeSerializer(many=True), description="The entries, oldest first; [] if none."),
        **errors(400),
    },
)
class ChangesView(EventsAPI, APIView):
    """Needs `cleanup.view_runlog` and `cleanup.view_moduleevent`. Ids increase and are never
    reused; an entry committed late is placed when it is committed, after everything
    already listed, so reading on from the highest id seen misses nothing. Ids may skip."""

    required_perms = {"GET": ["cleanup.view_runlog", "cleanup.view_moduleevent"]}
    pagination_class = None  # a sequence read on by `after`, not pages
    filters = ("after", "limit", "wait")

    def get(self, request: Request) -> Response:
        params = request.query_params
        after = whole_number(params, "after", 0, 0, MAX_ID)
        limit = whole_number(params, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        wait = whole_number(params, "wait", 0, 0, MAX_WAIT_S)
        deadline = clock() + wait
        while True:
            found = feed.entries_after(after, limit)
            left = deadline - clock()
            if found or left <= 0:
                break
            feed.release_connection()
            pause(min(POLL_S, left))
        response = Response(ChangeSerializer(found, many=True).data)
        last = found[-1]["id"] if found else after
        url = request.build_absolute_uri(request.path)
        response["Link"] = f'<{url}?after={last}&limit={limit}>; rel="next"'
        return response
