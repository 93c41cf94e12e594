"""The query parameters an endpoint takes: any other is refused, never silently ignored.

A console that misspells a filter (``?stauts=running``) or uses one an endpoint does not
have (``?search=troll``) would otherwise get the whole list and take it for the answer.
Each view names what its GET takes in ``filters``; its paginator's own parameters
(``page``, ``page_size``, ``cursor``: whichever it has) are taken too. A write takes none.
A parameter given twice is refused as well: which of the two would count is a guess.
May import: DRF and the API's errors.
"""

from django.http import QueryDict
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.views import APIView

from .errors import Invalid, UnknownParameter


class NoFormatParameter(DefaultContentNegotiation):
    """Content negotiation by ``Accept`` alone: DRF's ``?format=`` is not a parameter the API takes
    (answers are JSON), so it is refused as unknown like any other, rather than answering 404."""

    class settings:  # noqa: N801 - DRF reads ``self.settings.URL_FORMAT_OVERRIDE``
        URL_FORMAT_OVERRIDE = None


# The attributes of DRF's paginators that name a query parameter they read.
PAGINATOR_PARAMS = ("page_query_param", "page_size_query_param", "cursor_query_param", "limit_query_param")


def paginator_params(view: APIView) -> set[str]:
    # A list's paginator only: a detail view has one (DRF's generic views all do) but never reads it.
    paginator = getattr(view, "paginator", None) if hasattr(view, "list") else None
    if paginator is None:
        return set()
    return {name for attr in PAGINATOR_PARAMS if (name := getattr(paginator, attr, None))}


def taken(view: APIView, method: str | None) -> set[str]:
    """The query parameters ``view`` takes for ``method``."""
    if method not in ("GET", "HEAD"):
        return set()
    return set(getattr(view, "filters", ())) | paginator_params(view)


def check(view: APIView, request: Request) -> None:
    """400 ``unknown_parameter`` for a parameter the endpoint does not take; ``invalid`` for one given twice."""
    allowed = taken(view, request.method)
    params = request.query_params
    unknown = set(params) - allowed
    if unknown:
        raise UnknownParameter(unknown, allowed)
    repeated = {
        name: ["given more than once; give it once"] for name in sorted(params) if len(params.getlist(name)) > 1
    }
    if repeated:
        raise Invalid(repeated)


def flag(params: QueryDict, name: str) -> bool:
    """A yes/no query parameter: ``1``/``true`` or ``0``/``false`` (or absent: no); anything else is 400."""
    value = params.get(name)
    if value is None:
        return False
    if value in ("1", "true"):
        return True
    if value in ("0", "false"):
        return False
    raise Invalid({name: [f"must be 1, true, 0 or false, not {value!r}"]})
