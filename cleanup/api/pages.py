"""Cursor pages: every list walked on a stable order, exactly once.

A page ends at a row; the cursor to the next page names that row's place in the order
(its sort value and its id), not a page number. The next page is the rows after that
place, so rows created or resolved meanwhile neither push a row onto two pages nor
skip one. Each order ends on the id, which makes it total. ``?page_size=`` is 1 to 500
(50 by default); a larger one is refused, not cut down.

A list view names its orders in ``orderings`` (what ``?ordering=`` may say, each the
field it sorts on, ``-`` for newest first) and its default in ``default_ordering``.
May import: Django and DRF only.
"""

import base64
import binascii
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.db.models import Model, Q, QuerySet
from django.http import QueryDict
from django.utils.dateparse import parse_datetime
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import BasePagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

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


def encode(ordering: str, direction: str, key: Sequence[object] | None) -> str:
    raw = json.dumps({"o": ordering, "d": direction, "k": key}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


BAD_CURSOR = "not a cursor of this list: use the next or previous link it answered"


def decode(value: str, ordering: str) -> tuple[str, list[Any]]:
    """``(direction, [sort value, id])`` of a cursor this list gave, else 400 naming ``cursor``."""
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        cursor = json.loads(raw)
        direction, key = cursor["d"], cursor["k"]
        valid = (
            cursor["o"] == ordering
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
        if "cursor" in params:
            direction, cursor_key = decode(params["cursor"], self.ordering)
            key = cursor_key
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
        if direction == FORWARD:
            self.next = encode(self.ordering, FORWARD, last) if more else None
            self.previous = encode(self.ordering, BACKWARD, first) if key is not None and first is not None else None
        else:
            self.previous = encode(self.ordering, BACKWARD, first) if more else None
            self.next = encode(self.ordering, FORWARD, last) if last is not None else None
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
        return with_links(
            Response({"next": next_url, "previous": previous_url, "results": data}), next_url, previous_url
        )

    def get_paginated_response_schema(self, schema: dict[str, Any]) -> dict[str, Any]:
        link = {"type": "string", "format": "uri", "nullable": True}
        return {
            "type": "object",
            "required": ["next", "previous", "results"],
            "properties": {
                "next": {**link, "description": "The next page, null on the last."},
                "previous": {**link, "description": "The page before, null on the first."},
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
                "description": "Where the page starts: the `next` or `previous` link of the page before.",
                "schema": {"type": "string"},
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
