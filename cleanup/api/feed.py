"""`GET changes/`: the change feed, read, waited on or followed; and `position`, where it stands now.

A console reads what happened after the highest id it has seen (`?after=`), and with
``?wait=`` (up to 30 s) waits for it; with ``Accept: text/event-stream`` it follows the
feed as Server-Sent Events. `changes` is an async view: its synchronous part
(`ChangesView`: authentication, permissions, throttles, parameters, a first read) runs
once, gives its connection back, and the wait is then a coroutine parked on the process's
listener (`cleanup.api.waiting`), so a waiting console holds no worker, no thread and no
connection. The feed itself, one sequence over the run log and the modules' log, is
`cleanup.feed`.
May import: the models, `feed`, `serving`, the API's own modules.
"""

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, HttpResponse, HttpResponseBase, QueryDict, StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import feed
from ..models import LogKind, ModuleEventKind
from ..serving import leave_turn, own_threads
from . import params, waiting
from .views import MAX_ID, EventsAPI, errors

MAX_WAIT_S = 30
DEFAULT_LIMIT = 100
MAX_LIMIT = 500
KINDS = (*LogKind.values, *ModuleEventKind.values)
SSE_TYPE = "text/event-stream"
# A stream ends after this long (the browser's EventSource, or a console, reconnects with
# Last-Event-ID), and says something at least this often, so that no proxy or server
# closes it as idle.
STREAM_S = 300
KEEPALIVE_S = 15


def position() -> int:
    """The highest id in the change feed now; what happens from now on is listed after it."""
    return feed.position()


class ChangeSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField(help_text="Its place in the feed: ask for `?after=` the highest id read.")
    at = serializers.DateTimeField()
    kind = serializers.ChoiceField(choices=KINDS)
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


def kinds_of(params: QueryDict) -> frozenset[str] | None:
    value = params.get("kind")
    if value is None:
        return None
    asked = [k.strip() for k in value.split(",")]
    unknown = [k for k in asked if k not in KINDS]
    if unknown or not asked:
        raise ValidationError(
            {"kind": [f"unknown kind {', '.join(map(repr, unknown))}; allowed values: {', '.join(KINDS)}"]}
        )
    return frozenset(asked)


def last_event_id(request: Request) -> int | None:
    """The ``Last-Event-ID`` an event stream resumes from (a browser's EventSource sends it)."""
    value = request.headers.get("Last-Event-ID")
    if value is None or value == "":
        return None
    if not (value.isascii() and value.isdecimal()) or int(value) > MAX_ID:
        raise ValidationError({"Last-Event-ID": [f"the id of an event of this stream, got {value!r}"]})
    return int(value)


@dataclass(frozen=True)
class Wait:
    """What a request left to wait (by `changes`, the async view) asked for."""

    after: int
    limit: int
    run: int | None
    kinds: frozenset[str] | None
    wait_s: int
    stream: bool
    first: list[dict[str, Any]]
    next_url: str


# The serializer's fields, bound once: `change_data` is what ``ChangeSerializer(entry).data``
# is, without the copy of every field a serializer makes each time it is made.
_FIELDS = ChangeSerializer().fields


def change_data(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry as `ChangeSerializer` represents it."""
    return {
        name: None if entry[name] is None else field.to_representation(entry[name]) for name, field in _FIELDS.items()
    }


def _memo(kind: str, entry: dict[str, Any], render: Any) -> bytes:
    """The entry rendered as ``kind``, kept in the entry itself: an entry the process's
    listener holds is rendered once, however many waiting consoles it is told to."""
    key = f"_rendered_{kind}"
    found: bytes | None = entry.get(key)
    if found is None:
        found = entry[key] = render(change_data(entry))
    return found


def _json(data: dict[str, Any]) -> bytes:
    body: bytes = JSONRenderer().render(data)
    return body


def _event(data: dict[str, Any]) -> bytes:
    return f"id: {data['id']}\nevent: change\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def rendered(entries: list[dict[str, Any]]) -> bytes:
    """The entries as the API's JSON list (what `JSONRenderer` makes of the serializer's data)."""
    return b"[" + b",".join(_memo("json", entry, _json) for entry in entries) + b"]"


def next_link(url: str, last: int, limit: int) -> str:
    return f'<{url}?after={last}&limit={limit}>; rel="next"'


class JsonWhateverAccepted(params.NoFormatParameter):
    """The feed answers JSON, and its refusals are JSON, whatever ``Accept`` says: an event
    stream's request (``Accept: text/event-stream``) is checked as a JSON one is."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type


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
            "run",
            {"type": "integer", "minimum": 1, "maximum": MAX_ID},
            description="Only this run's entries (a run log's; no module's).",
        ),
        OpenApiParameter(
            "kind",
            {"type": "array", "items": {"type": "string", "enum": list(KINDS)}, "minItems": 1},
            style="form",
            explode=False,
            description="Only entries of these kinds, comma-separated.",
        ),
        OpenApiParameter(
            "Last-Event-ID",
            {"type": "integer", "minimum": 0, "maximum": MAX_ID},
            OpenApiParameter.HEADER,
            description="With `Accept: text/event-stream`: the id of the last event received; the stream "
            "resumes after it (as `after` does).",
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
    already listed, so reading on from the highest id seen misses nothing. Ids may skip.
    With `Accept: text/event-stream` the same entries come as Server-Sent Events, each
    with its id, as they happen (from `after`, from `Last-Event-ID`, else from now)."""

    required_perms = {"GET": ["cleanup.view_runlog", "cleanup.view_moduleevent"]}
    pagination_class = None  # a sequence read on by `after`, not pages
    filters = ("after", "limit", "wait", "run", "kind")
    content_negotiation_class = JsonWhateverAccepted

    def get(self, request: Request) -> HttpResponseBase:
        params = request.query_params
        stream = getattr(request._request, "event_stream", False)
        resume = last_event_id(request) if stream else None
        after = whole_number(params, "after", 0, 0, MAX_ID)
        limit = whole_number(params, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        wait = whole_number(params, "wait", 0, 0, MAX_WAIT_S)
        run = whole_number(params, "run", 0, 1, MAX_ID) if "run" in params else None
        kinds = kinds_of(params)
        if resume is not None:
            after = resume
        elif stream and "after" not in params:
            after = feed.position()
        # A wait's first look is at what the process's listener holds, when it is current (the
        # async view looked before this part began); else at the database.
        remembered = getattr(request._request, "feed_remembered", None)
        from_memory = remembered is not None and (wait or stream) and remembered[0] == (after, limit, run, kinds)
        found = (
            remembered[1] if remembered is not None and from_memory else feed.entries_after(after, limit, run, kinds)
        )
        url = request.build_absolute_uri(request.path)
        if stream or (wait and not found):
            # Left to `changes` to wait, with no connection held meanwhile.
            feed.release_connection()
            waits = Response(status=200)
            waits.waiting = Wait(after, limit, run, kinds, wait, stream, found, url)  # type: ignore[attr-defined]
            return waits
        # The listener's entries keep their JSON (a thousand consoles catching up read the same
        # ones); the database's are rendered for this answer.
        body = rendered(found) if from_memory else None
        response: HttpResponseBase = (
            HttpResponse(body, content_type="application/json")
            if body is not None
            else Response([change_data(entry) for entry in found])
        )
        response["Link"] = next_link(url, found[-1]["id"] if found else after, limit)
        return response


checked = ChangesView.as_view()


def _checked(request: HttpRequest) -> HttpResponseBase:
    """The synchronous part: authentication, permissions, throttles, parameters, a first read."""
    try:
        response = checked(request)
        if getattr(response, "waiting", None) is None and hasattr(response, "render"):
            response.render()
        return response
    finally:
        waiting.close_connection()


def remembered_first_look(
    request: HttpRequest, stream: bool
) -> tuple[tuple[int, int, int | None, frozenset[str] | None], list[dict[str, Any]]] | None:
    """A wait's first look from the listener's memory, keyed by what it asked (checked again,
    with the rest, by `ChangesView`): None when the query is not a wait, cannot be read here,
    or the memory is not current."""
    params = request.GET
    try:
        if not stream and whole_number(params, "wait", 0, 0, MAX_WAIT_S) == 0:
            return None
        if stream and ("after" not in params or request.META.get("HTTP_LAST_EVENT_ID")):
            return None
        after = whole_number(params, "after", 0, 0, MAX_ID)
        limit = whole_number(params, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        run = whole_number(params, "run", 0, 1, MAX_ID) if "run" in params else None
        kinds = kinds_of(params)
    except ValidationError:
        return None
    found = waiting.in_memory(after, limit, run, kinds)
    return None if found is None else ((after, limit, run, kinds), found)


@own_threads(waiting.executor, turns=waiting.TURNS)
async def changes(request: HttpRequest) -> HttpResponseBase:
    """`ChangesView`, with its waits (a long poll, an event stream) parked on the process's
    listener (`waiting`) instead of a worker, a thread or a connection."""
    stream = SSE_TYPE in request.headers.get("Accept", "")
    if stream:
        request.event_stream = True  # type: ignore[attr-defined]
    if isinstance(request, ASGIRequest):
        # The process listens from the feed's first request on, not from its first wait: the
        # consoles reading on through a backlog are then answered from memory too.
        waiting.hub()
    remembered = remembered_first_look(request, stream)
    if remembered is not None:
        request.feed_remembered = remembered  # type: ignore[attr-defined]
    # On the request's threads: the feed's own under the site's handler (`own_threads`).
    response = await sync_to_async(_checked)(request)
    plan: Wait | None = getattr(response, "waiting", None)
    if plan is None:
        return response
    waiting.let_go_of_request_thread()
    if plan.stream:
        # A stream's events cost little (each rendered once per process): it takes no turn
        # while it lasts, and is told of a change with the long polls, not after them.
        leave_turn()
        # Served by WSGI (runserver, a sync test server), a stream would be read whole before
        # it is sent: it then says what is there and ends, and the client asks again later.
        body = event_stream(plan, STREAM_S) if isinstance(request, ASGIRequest) else iter(stream_head(plan, 0))
        events = StreamingHttpResponse(body, content_type=SSE_TYPE)
        events["X-Accel-Buffering"] = "no"  # a proxy passes each event on at once
        return events
    found = await waiting.wait_for_entries(plan.after, plan.limit, plan.run, plan.kinds, plan.wait_s)
    answer = HttpResponse(rendered(found), content_type="application/json")
    answer["Link"] = next_link(plan.next_url, found[-1]["id"] if found else plan.after, plan.limit)
    return answer


changes.csrf_exempt = True  # type: ignore[attr-defined]  # a GET, as DRF's views are
# The schema is generated from the view class (`cleanup.api.schema` reads `cls`).
changes.cls = ChangesView  # type: ignore[attr-defined]
changes.initkwargs = {}  # type: ignore[attr-defined]
# As a class's `as_view` would say (the checks of the query parameters read them).
changes.view_class = ChangesView  # type: ignore[attr-defined]
changes.view_initkwargs = {}  # type: ignore[attr-defined]


def event(entry: dict[str, Any]) -> str:
    return _memo("event", entry, _event).decode()


def stream_head(plan: Wait, seconds: float) -> list[str]:
    """What a stream says first: when to reconnect, where it starts, what was there already.
    (Served by WSGI, that is the whole stream, read at once: a sync iterator, as WSGI wants.)"""
    return [f"retry: {1000 if seconds else 5000}\n: from {plan.after}\n\n", *map(event, plan.first)]


async def event_stream(plan: Wait, seconds: float) -> AsyncIterator[str]:
    """The feed after ``plan.after`` as Server-Sent Events, for ``seconds``."""
    loop = asyncio.get_running_loop()
    ends = loop.time() + seconds
    for line in stream_head(plan, seconds):
        yield line
    after = plan.first[-1]["id"] if plan.first else plan.after
    # A full batch may have more behind it: the next wait reads on at once.
    full = len(plan.first) >= plan.limit
    found: list[dict[str, Any]] = []
    while True:
        for entry in found:
            yield event(entry)
            after = entry["id"]
        left = ends - loop.time()
        if left <= 0:
            return
        wait_s = min(KEEPALIVE_S, left)
        found = await waiting.wait_for_entries(after, plan.limit, plan.run, plan.kinds, wait_s, looked=not full)
        full = len(found) >= plan.limit
        if not found:
            yield ": still here\n\n"
