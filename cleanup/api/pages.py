"""Cursor pages: every list walked on a stable order, exactly once.

A page ends at a row; the cursor to the next page names that row's place in the order
(its sort value and its id), not a page number. The next page is the rows after that
place, so rows created or resolved meanwhile neither push a row onto two pages nor
skip one. Each order ends on the id, which makes it total. ``?page_size=`` is 1 to 500
(50 by default); a larger one is refused, not cut down.

A list view names its orders in ``orderings`` (what ``?ordering=`` may say, each the
field it sorts on, ``-`` for newest first) and its default in ``default_ordering``.
A walk on a time it may change (``updated_at``) is exact only while no row changes: its
cursors carry when the walk began (or the oldest transaction then in flight), and
following one after a row of the list changed since answers 409
`walk_not_exact`, naming the exact orders (``id``, ``-id``). Every page also says where the
change feed stood before it was read (`FEED_POSITION_HEADER` and ``position``): a console
that lists, then follows the feed from there, misses no change made after its list.
A page answers a weak ``ETag`` of what it shows, and 304 to a current ``If-None-Match``
(`cleanup.api.conditional`).
May import: Django and DRF, `cleanup.feed` (its position) and the API's errors and conditionals.
"""

import base64
import binascii
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.db import connection
from django.db.models import Model, Q, QuerySet
from django.http import QueryDict
from django.utils.dateparse import parse_datetime
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import BasePagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import feed
from .conditional import conditional
from .errors import ApiError

FEED_POSITION_HEADER = "X-Feed-Position"
EXACT_ORDERINGS = ("id", "-id")
# When a walk by a time begins: now, or the start of the oldest transaction in flight if
# earlier (a row's time is taken inside its transaction, which may commit after the walk's
# first page was read).
WALK_BEGINS_SQL = (
    "SELECT least(clock_timestamp(), min(xact_start)) FROM pg_stat_activity"
    " WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
)


def walk_begins() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute(WALK_BEGINS_SQL)
        row = cursor.fetchone()
    began: datetime = row[0]
    return began


DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
FORWARD, BACKWARD = "n", "p"


def page_size(params: QueryDict) -> int:
    value = params.get("page_size")
    if value is None:
        return DEFAULT_PAGE_SIZE
    if not (value.isascii() and value.isdecimal()) or not 1 <= int(value) <= MAX_PAGE_SIZE:
        raise ValidationError({"page_size": [f"a whole number from 1 to {MAX_PAGE_SIZE}, got {value!r}"]})
    return int(value)


def ordering_of(view: APIView | None, params: QueryDict) -> str:
    """The order ``?ordering=`` asks for among the view's, else the view's default."""
    default: str = getattr(view, "default_ordering")  # noqa: B009  (every list view names one)
    orderings: Sequence[str] = getattr(view, "orderings", None) or [default]
    value = params.get("ordering")
    if value is None:
        return default
    if value not in orderings:
        raise ValidationError({"ordering": [f"unknown value {value!r}; allowed values: {', '.join(orderings)}"]})
    return value


def encode(ordering: str, direction: str, key: Sequence[object] | None, began: str | None = None) -> str:
    cursor: dict[str, object] = {"o": ordering, "d": direction, "k": key}
    if began is not None:
        cursor["s"] = began
    raw = json.dumps(cursor, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


BAD_CURSOR = "not a cursor of this list: use the next or previous link it answered"
EMPTY_CURSOR = "empty: leave cursor out for the first page"
# A cursor as the schema states it: what `encode` writes, unpadded base64url, never empty.
CURSOR_SCHEMA = {"type": "string", "minLength": 1, "pattern": "^[A-Za-z0-9_-]+$"}
CURSOR_HELP = (
    "Where the page starts: the `next` or `previous` link of the page before. Opaque: a cursor the "
    "list did not answer is refused (400 invalid); an empty one too, so leave it out for the first page."
)


def began_of(value: str) -> datetime | None:
    """When the walk of a cursor began (None for a walk by id), else 400 naming ``cursor``."""
    raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    began = json.loads(raw).get("s")
    if began is None:
        return None
    when = parse_datetime(began) if isinstance(began, str) else None
    if when is None:
        raise ValidationError({"cursor": [BAD_CURSOR]})
    return when


def decode(value: str, ordering: str) -> tuple[str, list[Any]]:
    """``(direction, [sort value, id])`` of a cursor this list gave, else 400 naming ``cursor``."""
    if not value:
        raise ValidationError({"cursor": [EMPTY_CURSOR]})
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        cursor = json.loads(raw)
        direction, key = cursor["d"], cursor["k"]
        valid = (
            isinstance(cursor, dict)
            and isinstance(cursor.get("s", ""), str)
            and cursor["o"] == ordering
            and direction in (FORWARD, BACKWARD)
            and isinstance(key, list)
            and len(key) == 2
            and isinstance(key[1], int)
            and not isinstance(key[1], bool)
        )
    except (ValueError, TypeError, KeyError, binascii.Error, UnicodeDecodeError):
        valid = False
    if not valid:
        raise ValidationError({"cursor": [BAD_CURSOR]})
    return direction, key


def link(request: Request, cursor: str | None) -> str | None:
    """The URL of this list at ``cursor``, its other parameters kept; None without a cursor."""
    if cursor is None:
        return None
    params = {k: v for k, v in request.query_params.items() if k != "cursor"}
    params["cursor"] = cursor
    return request.build_absolute_uri(request.path) + "?" + urlencode(params)


def with_links(response: Response, next_url: str | None, previous_url: str | None) -> Response:
    links = [f'<{url}>; rel="{rel}"' for url, rel in ((next_url, "next"), (previous_url, "prev")) if url]
    if links:
        response["Link"] = ", ".join(links)
    return response


def page_of_keys(
    keys: Sequence[tuple[int, int]], request: Request, ordering: str
) -> tuple[list[tuple[int, int]], str | None, str | None]:
    """A page of ``keys``, a sorted list of ``(rank, id)``: ``(keys, next URL, previous URL)``.

    For lists the engine computes (the cleanup plan's groups), paged as the others are.
    """
    size = page_size(request.query_params)
    direction, key = FORWARD, None
    if "cursor" in request.query_params:
        direction, pair = decode(request.query_params["cursor"], ordering)
        if not isinstance(pair[0], int) or isinstance(pair[0], bool):
            raise ValidationError({"cursor": [BAD_CURSOR]})
        key = (pair[0], pair[1])
    if direction == FORWARD:
        candidates = [k for k in keys if key is None or k > key]
        page, more = candidates[:size], len(candidates) > size
    else:
        assert key is not None  # only a cursor goes back
        candidates = [k for k in keys if k < key]
        page, more = candidates[-size:], len(candidates) > size
    first = list(page[0]) if page else (list(key) if key else None)
    last = list(page[-1]) if page else (list(key) if key else None)
    if direction == FORWARD:
        next_cursor = encode(ordering, FORWARD, last) if more else None
        previous_cursor = encode(ordering, BACKWARD, first) if key is not None else None
    else:
        previous_cursor = encode(ordering, BACKWARD, first) if more else None
        next_cursor = encode(ordering, FORWARD, last) if last is not None else None
    return page, link(request, next_cursor), link(request, previous_cursor)


class CursorPage(BasePagination):
    """``{"next", "previous", "results"}`` and a ``Link`` header, on a stable order."""

    # The query parameters it reads (`cleanup.api.params` allows them on a list).
    cursor_query_param = "cursor"
    page_size_query_param = "page_size"

    def paginate_queryset(
        self, queryset: QuerySet[Any, Any] | Sequence[Any], request: Request, view: APIView | None = None
    ) -> list[Any]:
        if not isinstance(queryset, QuerySet):
            raise TypeError("a cursor page reads a queryset, in the database's order")
        params = request.query_params
        self.request = request
        size = page_size(params)
        self.ordering = ordering_of(view, params)
        self.descending = self.ordering.startswith("-")
        self.field = self.ordering.lstrip("-")
        sign = "-" if self.descending else ""
        order = [f"{sign}{self.field}", f"{sign}id"] if self.field != "id" else [f"{sign}id"]
        direction, key = FORWARD, None
        # Where the feed stands before the rows are read: what changes after is in the feed.
        self.position = feed.placed()
        self.began: str | None = None
        if self.field != "id":
            self.began = walk_begins().isoformat()
        if "cursor" in params:
            direction, cursor_key = decode(params["cursor"], self.ordering)
            key = cursor_key
            walk_began = began_of(params["cursor"]) if self.field != "id" else None
            if walk_began is not None:
                self.began = walk_began.isoformat()
                if queryset.filter(**{f"{self.field}__gte": walk_began}).exists():
                    raise ApiError(
                        409,
                        "walk_not_exact",
                        f"rows of this list changed since its walk by {self.ordering!r} began, so it could "
                        f"miss or repeat one: walk by {' or '.join(EXACT_ORDERINGS)} (exact), or start again",
                    )
            queryset = queryset.filter(self.beyond(key, forward=direction == FORWARD))
        if direction == BACKWARD:
            order = [o[1:] if o.startswith("-") else f"-{o}" for o in order]
        rows = list(queryset.order_by(*order)[: size + 1])
        more = len(rows) > size
        rows = rows[:size]
        if direction == BACKWARD:
            rows.reverse()
        first = self.key_of(rows[0]) if rows else key
        last = self.key_of(rows[-1]) if rows else key
        began = self.began
        if direction == FORWARD:
            self.next = encode(self.ordering, FORWARD, last, began) if more else None
            self.previous = (
                encode(self.ordering, BACKWARD, first, began) if key is not None and first is not None else None
            )
        else:
            self.previous = encode(self.ordering, BACKWARD, first, began) if more else None
            self.next = encode(self.ordering, FORWARD, last, began) if last is not None else None
        return rows

    def key_of(self, row: Model) -> list[Any]:
        value = getattr(row, self.field)
        if isinstance(value, datetime):
            value = value.isoformat()
        return [value, row.pk]

    def beyond(self, key: Sequence[Any], forward: bool) -> Q:
        """The rows past ``key`` in the order (before it, going back)."""

        value, pk = key
        if self.field != "id":
            value = parse_datetime(value) if isinstance(value, str) else None
            if value is None:
                raise ValidationError({"cursor": [BAD_CURSOR]})
        after = forward != self.descending  # greater values come next
        op = "gt" if after else "lt"
        if self.field == "id":
            return Q(**{f"id__{op}": pk})
        return Q(**{f"{self.field}__{op}": value}) | Q(**{self.field: value, f"id__{op}": pk})

    def get_paginated_response(self, data: Any) -> Response:
        next_url, previous_url = link(self.request, self.next), link(self.request, self.previous)
        response = Response({"next": next_url, "previous": previous_url, "position": self.position, "results": data})
        response[FEED_POSITION_HEADER] = str(self.position)
        # A weak tag of what the page shows: its rows, and whether pages come before and after.
        shown = {"results": data, "more": [self.next is not None, self.previous is not None]}
        return conditional(self.request, with_links(response, next_url, previous_url), weak=True, shown=shown)

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        link = {"type": "string", "format": "uri", "nullable": True}
        return {
            "type": "object",
            "required": ["next", "previous", "position", "results"],
            "properties": {
                "next": {**link, "description": "The next page, null on the last."},
                "previous": {**link, "description": "The page before, null on the first."},
                "position": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Where the change feed stood before this page was read (also the "
                    "`X-Feed-Position` header): follow `changes/?after=` it to see every change since.",
                },
                "results": schema,
            },
        }

    def get_schema_operation_parameters(self, view: APIView) -> list[dict[str, Any]]:
        orderings = getattr(view, "orderings", None)
        parameters: list[dict[str, Any]] = [
            {
                "name": "cursor",
                "required": False,
                "in": "query",
                "description": CURSOR_HELP,
                "schema": CURSOR_SCHEMA,
            },
            {
                "name": "page_size",
                "required": False,
                "in": "query",
                "description": f"Rows per page, 1 to {MAX_PAGE_SIZE} (default {DEFAULT_PAGE_SIZE}).",
                "schema": {"type": "integer", "minimum": 1, "maximum": MAX_PAGE_SIZE},
            },
        ]
        if orderings:
            parameters.append(
                {
                    "name": "ordering",
                    "required": False,
                    "in": "query",
                    "description": f"The order (default {getattr(view, 'default_ordering', 'id')}); ties go by id.",
                    "schema": {"type": "string", "enum": list(orderings)},
                }
            )
        return parameters
