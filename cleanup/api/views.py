"""One view per endpoint, each a few lines over the engine (see `cleanup.api`).

May import: the engine's entry points, the models, `calls` (a backend's name), `enqueue` for
queueing, the API's own modules.
"""

from datetime import UTC
from typing import Any, TypeVar
from urllib.parse import urlencode

from django.db.models import Count, Model, Q, QuerySet
from django.db.models.enums import Choices
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404
from django.urls import reverse
from django.utils.dateparse import parse_datetime
from django.views import defaults
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import BasePagination
from rest_framework.parsers import BaseParser
from rest_framework.permissions import BasePermission
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import BaseSerializer
from rest_framework.throttling import BaseThrottle
from rest_framework.views import APIView

from ..calls import MAX_BACKEND, backend_name_ok
from ..enqueue import queue_reconcile
from ..feed import position
from ..manual import request_cleanup, waive
from ..models import UNRESOLVED, CleanupStatus, ModuleHealth, Resource, ResourceState, Run, RunLog, RunStatus
from ..plan import group_keys, plan_of_groups, unread_ids
from ..reconcile import module_known
from ..runner import RunQuotaExceeded, RunSpecError, RunStateError, cancel_run, start_run
from ..sweep import CleanupRefused
from . import params
from . import serializers as s
from .conditional import IF_MATCH, IF_NONE_MATCH, NOT_MODIFIED, ETagged, check_if_match
from .errors import Conflict, error_response
from .idempotency import IdempotentPosts
from .pages import CURSOR_HELP, CURSOR_SCHEMA, CursorPage, page_of_keys, with_links
from .parsers import BoundedJSONParser
from .permissions import StaffWithPermissions
from .throttles import EventsThrottle, QuotaExceeded

# The largest id a BigAutoField holds: a foreign-key filter past it fails in the database
# instead of matching nothing.
MAX_ID = 2**63 - 1

_Row = TypeVar("_Row", bound=Model)


class EventsAPI(IdempotentPosts):
    # Staff only, JSON in and out; `required_perms` names each method's permissions; a POST
    # with an Idempotency-Key is done once (`idempotency`). (A comment, not a docstring:
    # the schema would show it as every endpoint's description.)

    permission_classes: list[type[BasePermission]] = [StaffWithPermissions]
    throttle_classes: list[type[BaseThrottle]] = [EventsThrottle]
    parser_classes: list[type[BaseParser]] = [BoundedJSONParser]
    renderer_classes: list[type[BaseRenderer]] = [JSONRenderer]
    content_negotiation_class = params.NoFormatParameter
    pagination_class: type[BasePagination] | None = CursorPage
    required_perms: dict[str, list[str]] = {}
    # The query parameters a GET takes besides the paginator's; any other answers 400
    # `unknown_parameter` (`params`).
    filters: tuple[str, ...] = ()
    # A list's order (`cleanup.api.pages`): the default, and what ?ordering= may ask for.
    default_ordering = "id"
    orderings: tuple[str, ...] = ()

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        # After authentication and permissions (401/403 first), and only for a method the
        # endpoint has (405 for the others, whatever their query).
        if hasattr(self, (request.method or "").lower()):
            params.check(self, request)


def actor(request: Request) -> str:
    username: str = request.user.get_username()
    return username


def api_url(request: Request, url_name: str, **kwargs: object) -> str:
    """The absolute URL of the endpoint ``url_name``, under the same API (and version) as ``request``."""
    namespace = request.resolver_match.namespace if request.resolver_match else ""
    return request.build_absolute_uri(reverse(f"{namespace}:{url_name}" if namespace else url_name, kwargs=kwargs))


def accepted(request: Request, serializer: type[BaseSerializer[Any]], answer: object, location: str) -> Response:
    """A 202: the work is queued; ``Location`` says what to follow, ``after`` where the feed stands."""
    return Response(serializer(answer).data, status=status.HTTP_202_ACCEPTED, headers={"Location": location})


def runs() -> QuerySet[Run]:
    """Runs with their count of unresolved rows, as every run the API shows carries it."""
    # Explicitly newest first: Meta.ordering is not applied to an aggregating query.
    return Run.objects.annotate(unresolved=Count("resources", filter=Q(resources__state__in=UNRESOLVED))).order_by(
        "-id"
    )


def get_run(pk: int) -> Run:
    return get_object_or_404(runs().prefetch_related("steps"), pk=pk)


def run_matches(request: Request, pk: int) -> None:
    """With ``If-Match``: 404 without the run, 412 when it is not the run's ETag (as `GET runs/{id}/`
    answers it). Without one, nothing is read."""
    check_if_match(request, lambda: s.RunDetailSerializer(get_run(pk)).data, f"run {pk}")


def by_choices(queryset: QuerySet[_Row], params: QueryDict, **fields: type[Choices]) -> QuerySet[_Row]:
    """``queryset`` narrowed by the query parameters in ``fields``, each checked against its choices."""
    errors: dict[str, list[str]] = {}
    for field, choices in fields.items():
        value = params.get(field)
        if value is None:
            continue
        if value not in choices.values:
            errors[field] = [f"unknown value {value!r}; allowed values: {', '.join(choices.values)}"]
            continue
        queryset = queryset.filter(**{field: value})
    if errors:
        raise ValidationError(errors)
    return queryset


BAD_BACKEND = (
    f"not a backend's name: a backend is text of at most {MAX_BACKEND} characters, "
    "without '/' or NUL, and without spaces at either end"
)


def backend_checked(backend: str, field: str = "backend") -> str:
    """``backend`` when it can be a backend's name (`cleanup.calls.backend_name_ok`), else 400."""
    if not backend_name_ok(backend):
        raise ValidationError({field: [BAD_BACKEND]})
    return backend


def by_backend(queryset: QuerySet[_Row], params: QueryDict) -> QuerySet[_Row]:
    """``queryset`` narrowed to ``?backend=`` (empty: a module's only backend), when given.

    As the ``module`` filter: a name no backend can have (a NUL, which PostgreSQL refuses in
    a query, a '/') matches nothing; the answer is an empty list, not an error.
    """
    if "backend" not in params:
        return queryset
    backend = params["backend"]
    return queryset.filter(backend=backend) if backend_name_ok(backend) else queryset.none()


# What ?ordering= may ask of runs and ledger rows; ties go by id.
ORDERINGS = ("id", "-id", "updated_at", "-updated_at")


def by_updated_since(queryset: QuerySet[_Row], params: QueryDict) -> QuerySet[_Row]:
    """``queryset`` narrowed to the rows changed at or after ``?updated_since=`` (RFC 3339, with its zone)."""
    value = params.get("updated_since")
    if value is None:
        return queryset
    try:
        when = parse_datetime(value)
        # In UTC: the database refuses some offsets a string can carry (-22:38).
        when = when.astimezone(UTC) if when is not None and when.tzinfo is not None else None
    except (ValueError, OverflowError):
        when = None
    if when is None:
        raise ValidationError(
            {"updated_since": [f"a time in RFC 3339 with its zone, such as 2026-12-01T18:00:00Z, got {value!r}"]}
        )
    return queryset.filter(updated_at__gte=when)


UPDATED_SINCE = OpenApiParameter(
    "updated_since",
    {"type": "string", "format": "date-time"},
    description="Only those changed at or after this time (RFC 3339, with its zone). "
    "For exactly what happened since a moment, read the change feed instead.",
)


PLAN_PAGE_PARAMS = [
    OpenApiParameter("cursor", CURSOR_SCHEMA, description=CURSOR_HELP),
    OpenApiParameter(
        "page_size",
        {"type": "integer", "minimum": 1, "maximum": 500},
        description="Groups per page, 1 to 500 (default 50).",
    ),
]


# -- the schema's shared parts ----------------------------------------------------------


def errors(*codes: int) -> dict[int, type[BaseSerializer[Any]]]:
    """The error responses an endpoint answers besides those every operation does (those are
    added to each by `cleanup.api.schema.declare_errors`): 409 where its state can refuse."""
    return dict.fromkeys(codes, s.ErrorSerializer)


def choice_param(name: str, choices: type[Choices], description: str) -> OpenApiParameter:
    return OpenApiParameter(name, str, enum=list(choices.values), description=description)


BACKEND_PARAM = OpenApiParameter(
    "backend",
    str,
    description='Only those of this backend ("" for a module\'s only backend); '
    "a name no backend can have matches nothing.",
)
BACKEND_PATH = OpenApiParameter(
    "backend",
    str,
    OpenApiParameter.PATH,
    description=f"The backend's name (text without '/', at most {MAX_BACKEND} characters); "
    "400 for a name no backend can have.",
)


# -- runs -----------------------------------------------------------------------------


@extend_schema(tags=["runs"])
class RunListView(EventsAPI, generics.ListAPIView[Run]):
    """Listing needs `cleanup.view_run`; starting a run needs `cleanup.add_run`."""

    serializer_class = s.RunSerializer
    required_perms = {"GET": ["cleanup.view_run"], "POST": ["cleanup.add_run"]}
    filters = ("status", "cleanup_status", "updated_since", "ordering")
    default_ordering = "-id"
    orderings = ORDERINGS

    def get_queryset(self) -> QuerySet[Run]:
        params = self.request.query_params
        return by_updated_since(by_choices(runs(), params, status=RunStatus, cleanup_status=CleanupStatus), params)

    def get_serializer_class(self) -> type[BaseSerializer[Any]]:
        # OPTIONS describes the POST input with this, not the runs it lists.
        return s.RunStartSerializer if self.request and self.request.method == "POST" else s.RunSerializer

    @extend_schema(
        summary="List runs, newest first",
        parameters=[
            choice_param("status", RunStatus, "Only runs in this status."),
            choice_param("cleanup_status", CleanupStatus, "Only runs in this cleanup status."),
            UPDATED_SINCE,
        ],
        responses={200: s.RunSerializer(many=True), **errors(400, 404)},
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        summary="Start a run",
        request=s.RunStartSerializer,
        responses={201: s.RunDetailSerializer, **errors(400)},
    )
    def post(self, request: Request) -> Response:
        body = request.data
        if not isinstance(body, dict):
            raise ValidationError({"non_field_errors": ['the body is a JSON object {"name", "steps"}']})
        unknown = {field: ["unknown field"] for field in sorted(set(body) - {"name", "steps"})}
        if unknown:
            raise ValidationError(unknown)
        try:
            run = start_run(body.get("name"), body.get("steps"), actor=actor(request))
        except RunQuotaExceeded as exc:
            raise QuotaExceeded(" ".join(exc.errors.values()), wait=exc.retry_after_s) from None
        except RunSpecError as exc:
            raise ValidationError({field: [message] for field, message in exc.errors.items()}) from None
        return Response(
            s.RunDetailSerializer(get_run(run.pk)).data,
            status=status.HTTP_201_CREATED,
            headers={"Location": api_url(request, "events-run", pk=run.pk)},
        )


@extend_schema(
    tags=["runs"],
    summary="A run with its steps",
    parameters=[IF_NONE_MATCH],
    responses={200: s.RunDetailSerializer, 304: NOT_MODIFIED, **errors(404)},
)
class RunDetailView(ETagged, EventsAPI, generics.RetrieveAPIView[Run]):
    """Needs `cleanup.view_run`."""

    serializer_class = s.RunDetailSerializer
    required_perms = {"GET": ["cleanup.view_run"]}

    def get_object(self) -> Run:
        return get_run(self.kwargs["pk"])


@extend_schema(
    tags=["runs"],
    summary="Cancel a running run",
    request=s.CancelSerializer,
    parameters=[IF_MATCH],
    responses={200: s.RunDetailSerializer, **errors(400, 404, 409, 412)},
)
class RunCancelView(EventsAPI, APIView):
    """Needs `cleanup.change_run`. Only a running run can be cancelled (409 otherwise); with
    `"cleanup": false` its ledger rows stay unreverted until a person asks for a cleanup."""

    required_perms = {"POST": ["cleanup.change_run"]}

    def post(self, request: Request, pk: int) -> Response:
        run_matches(request, pk)
        body = s.CancelSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            cancel_run(pk, cleanup=body.validated_data["cleanup"], actor=actor(request))
        except Run.DoesNotExist:
            raise NotFound() from None
        except RunStateError as exc:
            raise Conflict("run_ended", str(exc)) from None
        return Response(s.RunDetailSerializer(get_run(pk)).data)


@extend_schema(
    tags=["runs"],
    summary="Clean up an ended run now (a person's retry: resets its attempts unless reset is false)",
    request=s.CleanupSerializer,
    parameters=[IF_MATCH],
    responses={202: s.CleanupQueuedSerializer, **errors(400, 404, 409, 412)},
)
class RunCleanupView(EventsAPI, APIView):
    """Needs `cleanup.cleanup_run`. Puts the run's unresolved rows back under the attempt
    ceiling (`"reset": false` keeps the counters), logs `cleanup.retry` with the actor and
    queues a pass. A run still in flight, or one that owes nothing, answers 409 and nothing
    changes. `Location` is the run; `after` the feed's position to follow the pass from."""

    required_perms = {"POST": ["cleanup.cleanup_run"]}

    def post(self, request: Request, pk: int) -> Response:
        run_matches(request, pk)
        body = s.CleanupSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = get_object_or_404(Run, pk=pk)
        after = position()
        try:
            reset = request_cleanup(run, actor(request), reset=body.validated_data["reset"])
        except CleanupRefused as exc:
            run.refresh_from_db()
            raise Conflict(
                "run_in_flight" if run.status == RunStatus.RUNNING else "nothing_to_clean", str(exc)
            ) from None
        answer = {"run": get_run(pk), "reset": reset, "queued": True, "after": after}
        return accepted(request, s.CleanupQueuedSerializer, answer, api_url(request, "events-run", pk=pk))


@extend_schema(
    tags=["runs"],
    summary="Waive many of a run's rows in one call; nothing is given back",
    request=s.RunWaiveSerializer,
    parameters=[IF_MATCH],
    responses={200: s.RunWaivedSerializer, **errors(400, 404, 409, 412)},
)
class RunWaiveView(EventsAPI, APIView):
    """Needs `cleanup.cleanup_run`. Resolves the rows named (`"rows": [ids]`, each a row of
    this run, else 400) or every unresolved row of the run (`"rows": "all"`) as `waived`,
    with the reason and the actor, as one waiver of each row would. Rows already resolved,
    or held by a sweeper now, are left as they are; when that leaves nothing to waive, 409."""

    required_perms = {"POST": ["cleanup.cleanup_run"]}

    def post(self, request: Request, pk: int) -> Response:
        run_matches(request, pk)
        run = get_object_or_404(Run, pk=pk)
        body = s.RunWaiveSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        asked = body.validated_data["rows"]
        rows = run.resources.filter(state__in=UNRESOLVED)
        if asked != "all":
            strangers = sorted(set(asked) - set(run.resources.filter(pk__in=asked).values_list("id", flat=True)))
            if strangers:
                raise ValidationError({"rows": [f"not rows of run {run.pk}: {', '.join(map(str, strangers[:20]))}"]})
            rows = rows.filter(pk__in=asked)
        after = position()
        waived = waive(list(rows.only("id", "run_id")), body.validated_data["reason"], actor(request))
        if not waived:
            raise Conflict(
                "already_resolved",
                f"nothing to waive in run {run.pk}: the rows asked are resolved, or held by a sweeper right now",
            )
        answer = {"run": get_run(pk), "waived": waived, "after": after}
        return Response(s.RunWaivedSerializer(answer).data)


@extend_schema(
    tags=["runs"],
    summary="What the next cleanup pass would do, without doing it",
    parameters=[
        OpenApiParameter(
            "live",
            str,
            enum=["1", "true", "0", "false"],
            description="1 or true: also read each leased target's live value through its lease: at most "
            "EVENT_LIVE_READS_PER_REQUEST values, within EVENT_LIVE_READ_BUDGET_S; `unread` lists the others.",
        ),
        *PLAN_PAGE_PARAMS,
    ],
    responses={200: s.CleanupPlanSerializer, **errors(404)},
)
class RunCleanupPlanView(EventsAPI, APIView):
    """Needs `cleanup.view_run` and `cleanup.view_resource`. Reads only: groups, the verb that
    gives each back, its rows and their attempts left."""

    required_perms = {"GET": ["cleanup.view_run", "cleanup.view_resource"]}
    filters = ("live", "cursor", "page_size")

    def get(self, request: Request, pk: int) -> Response:
        live = params.flag(request.query_params, "live")
        run = get_object_or_404(Run, pk=pk)
        keys, next_url, previous_url = page_of_keys(group_keys(run), request, "plan")
        groups = plan_of_groups(run, keys, live=live)
        answer: dict[str, Any] = {"run": run.pk, "next": next_url, "previous": previous_url, "groups": groups}
        if live:
            answer["unread"] = unread_ids(groups)
        return with_links(Response(s.CleanupPlanSerializer(answer).data), next_url, previous_url)


@extend_schema(
    tags=["runs"],
    summary="A run's ledger rows",
    parameters=[choice_param("state", ResourceState, "Only rows in this state."), BACKEND_PARAM, UPDATED_SINCE],
    responses={200: s.ResourceSerializer(many=True), **errors(400, 404)},
)
class RunResourcesView(EventsAPI, generics.ListAPIView[Resource]):
    """Needs `cleanup.view_resource`."""

    serializer_class = s.ResourceSerializer
    required_perms = {"GET": ["cleanup.view_resource"]}
    filters = ("state", "backend", "updated_since", "ordering")
    orderings = ORDERINGS

    def get_queryset(self) -> QuerySet[Resource]:
        run = get_object_or_404(Run, pk=self.kwargs["pk"])
        params = self.request.query_params
        rows = by_updated_since(run.resources.select_related("run"), params)
        return by_backend(by_choices(rows, params, state=ResourceState), params)


@extend_schema(tags=["runs"], summary="A run's log", responses={200: s.RunLogSerializer(many=True), **errors(404)})
class RunLogView(EventsAPI, generics.ListAPIView[RunLog]):
    """Needs `cleanup.view_runlog`. Oldest first."""

    serializer_class = s.RunLogSerializer
    required_perms = {"GET": ["cleanup.view_runlog"]}

    def get_queryset(self) -> QuerySet[RunLog]:
        return get_object_or_404(Run, pk=self.kwargs["pk"]).log.order_by("id")


# -- the ledger -----------------------------------------------------------------------


@extend_schema(
    tags=["resources"],
    summary="The ledger",
    parameters=[
        choice_param("state", ResourceState, "Only rows in this state."),
        OpenApiParameter("module", str, description="Only rows of this module."),
        BACKEND_PARAM,
        OpenApiParameter(
            "run", {"type": "integer", "minimum": 1, "maximum": MAX_ID}, description="Only rows of this run."
        ),
        UPDATED_SINCE,
    ],
    responses={200: s.ResourceSerializer(many=True), **errors(400, 404)},
)
class ResourceListView(EventsAPI, generics.ListAPIView[Resource]):
    """Needs `cleanup.view_resource`."""

    serializer_class = s.ResourceSerializer
    required_perms = {"GET": ["cleanup.view_resource"]}
    filters = ("state", "module", "backend", "run", "updated_since", "ordering")
    orderings = ORDERINGS

    def get_queryset(self) -> QuerySet[Resource]:
        params = self.request.query_params
        rows = by_choices(Resource.objects.select_related("run"), params, state=ResourceState)
        rows = by_updated_since(rows, params)
        if "module" in params:
            # No row can hold a NUL, and PostgreSQL refuses one in a query.
            rows = rows.none() if "\x00" in params["module"] else rows.filter(module=params["module"])
        rows = by_backend(rows, params)
        if "run" in params:
            run = params["run"]
            if not (run.isdecimal() and 0 < int(run) <= MAX_ID):
                raise ValidationError({"run": [f"a run id is a whole number from 1 to {MAX_ID}, got {run!r}"]})
            rows = rows.filter(run_id=int(run))
        return rows


@extend_schema(
    tags=["resources"],
    summary="One ledger row",
    parameters=[IF_NONE_MATCH],
    responses={200: s.ResourceSerializer, 304: NOT_MODIFIED, **errors(404)},
)
class ResourceDetailView(ETagged, EventsAPI, generics.RetrieveAPIView[Resource]):
    """Needs `cleanup.view_resource`."""

    serializer_class = s.ResourceSerializer
    queryset = Resource.objects.select_related("run")
    required_perms = {"GET": ["cleanup.view_resource"]}


@extend_schema(
    tags=["resources"],
    summary="Resolve an unresolved row by hand; nothing is given back",
    request=s.WaiveSerializer,
    parameters=[IF_MATCH],
    responses={200: s.ResourceSerializer, **errors(400, 404, 409, 412)},
)
class ResourceWaiveView(EventsAPI, APIView):
    """Needs `cleanup.cleanup_run`. The row is resolved as `waived` with the reason and the
    actor, and logged; a row already resolved, or held by a sweeper now, answers 409."""

    required_perms = {"POST": ["cleanup.cleanup_run"]}

    def post(self, request: Request, pk: int) -> Response:
        row = get_object_or_404(Resource.objects.select_related("run"), pk=pk)
        check_if_match(request, lambda: s.ResourceSerializer(row).data, f"ledger row {pk}")
        body = s.WaiveSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        waived = waive([row], body.validated_data["reason"], actor(request))
        row.refresh_from_db()
        if not waived:
            raise Conflict(
                "already_resolved",
                f"resource {pk} is {row.state}; only an unresolved row that no sweeper holds can be waived",
            )
        return Response(s.ResourceSerializer(row).data)


# -- modules and the whole --------------------------------------------------------------


@extend_schema(
    tags=["modules"],
    summary="Ask a module which of its ledgered resources are still in the world",
    request=s.ReconcileSerializer,
    responses={202: s.ReconcileQueuedSerializer, **errors(400, 404)},
)
class ModuleReconcileView(EventsAPI, APIView):
    """Needs `cleanup.cleanup_run`. Queues the reconcile of every backend of the module; rows
    the module no longer has become `orphaned`. A module neither registered nor owning
    ledger rows answers 404."""

    required_perms = {"POST": ["cleanup.cleanup_run"]}

    def post(self, request: Request, name: str, backend: str | None = None) -> Response:
        body = s.ReconcileSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if backend is not None:
            backend_checked(backend)
        # Checked here because the reconcile itself runs later, in a worker.
        if not module_known(name):
            raise NotFound()
        restarted = body.validated_data["restarted"]
        after = position()
        queue_reconcile(module=name, restarted=restarted, backend=backend)
        answer: dict[str, Any] = {"module": name, "restarted": restarted, "queued": True, "after": after}
        # What to follow: the module's log, where the reconcile's findings are written.
        location = api_url(request, "events-module-log", name=name)
        if backend is None:
            return accepted(request, s.ReconcileQueuedSerializer, answer, location)
        answer["backend"] = backend
        location += "?" + urlencode({"backend": backend})
        return accepted(request, s.BackendReconcileQueuedSerializer, answer, location)


@extend_schema(
    tags=["modules"],
    summary="Ask one backend of a module which of its ledgered resources are still in the world",
    request=s.ReconcileSerializer,
    parameters=[BACKEND_PATH],
    responses={202: s.BackendReconcileQueuedSerializer, **errors(400, 404)},
)
class BackendReconcileView(ModuleReconcileView):
    """Needs `cleanup.cleanup_run`. Queues the reconcile of that backend's rows alone
    (`"restarted": true` as after its restart: its recently given-back rows too). A module
    neither registered nor owning ledger rows answers 404; a name no backend can have, 400."""

    def post(self, request: Request, name: str, backend: str | None = None) -> Response:
        return super().post(request, name, backend)


def counts(queryset: QuerySet[Any], field: str, choices: type[Choices]) -> dict[str, int]:
    """How many of ``queryset`` have each value of ``field``, every choice present."""
    found = dict(queryset.order_by().values_list(field).annotate(n=Count("id")))
    return {**dict.fromkeys(choices.values, 0), **found}


@extend_schema(
    tags=["summary"], summary="Runs and ledger rows counted", responses={200: s.SummarySerializer, **errors()}
)
class SummaryView(EventsAPI, APIView):
    """Needs `cleanup.view_run` and `cleanup.view_resource`."""

    required_perms = {"GET": ["cleanup.view_run", "cleanup.view_resource"]}

    def get(self, request: Request) -> Response:
        by_state = counts(Resource.objects.all(), "state", ResourceState)
        answer = {
            "runs": {
                "total": Run.objects.count(),
                "status": counts(Run.objects.all(), "status", RunStatus),
                "cleanup_status": counts(Run.objects.all(), "cleanup_status", CleanupStatus),
            },
            "resources": {
                "total": sum(by_state.values()),
                "state": by_state,
                "unresolved": sum(by_state[state] for state in UNRESOLVED),
            },
            "modules_down": [
                {
                    "module": h.module,
                    "backend": h.backend,
                    "name": h.name,
                    "since": h.down_since,
                    "last_error": h.last_error,
                    "waiting": h.waiting_text(),
                }
                for h in ModuleHealth.objects.down().order_by("module", "backend")
            ],
        }
        return Response(s.SummarySerializer(answer).data)


# -- the site's error pages, as JSON under /api/ ----------------------------------------


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """A URL no endpoint matches answers JSON under /api/, like every other API error."""
    if request.path.startswith("/api/"):
        return error_response(404)
    return defaults.page_not_found(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        return error_response(500)
    return defaults.server_error(request)
