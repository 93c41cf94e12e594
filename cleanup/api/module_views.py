"""The API's module endpoints: each backend's health, marking one down or up, and their log.

A module serves one backend ("") or many; each has its own health. ``modules/`` lists every
module with the fields of its backend "" at the top (as before backends) and every backend
in ``backends``; ``modules/{name}/down|up/`` mark its backend "", and
``modules/{name}/backends/{backend}/down|up/`` any other, one never seen included (the
engine makes its health row). Each view is a few lines over `cleanup.outages`. Marking
answers the new state, or 409 when it already is in the state asked for (nothing changes,
nothing is logged).
May import: `outages`, `registry`, the models and the API's own modules.
"""

from collections.abc import Collection, Iterable
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import deadman, outages, registry
from ..models import ModuleEvent, ModuleHealth, ModuleState
from . import serializers as s
from .conditional import IF_NONE_MATCH, NOT_MODIFIED, conditional
from .errors import Conflict
from .views import BACKEND_PARAM, BACKEND_PATH, EventsAPI, actor, backend_checked, by_backend, errors


def describe(health: ModuleHealth, registered: Collection[str]) -> dict[str, Any]:
    """One backend's health, as `serializers.BackendHealthSerializer` reads it."""
    down = health.state == ModuleState.DOWN
    return {
        "module": health.module,
        "backend": health.backend,
        "name": health.name,
        "registered": health.module in registered,
        "state": health.state,
        "since": health.down_since if down else None,
        "last_error": health.last_error,
        "failures_in_row": health.failures_in_row,
        "next_probe_at": health.next_probe_at if down else None,
        "changed_by": health.changed_by,
        "boot_id": health.boot_id,
        "restarts_seen": health.restarts_seen,
        "reconcile_owed_since": health.reconcile_owed_since,
        "waiting": health.waiting_text() if down else None,
        "switch": deadman.shown(health.module, health.backend),
    }


def describe_module(module: str, healths: Iterable[ModuleHealth], registered: Collection[str]) -> dict[str, Any]:
    """A module: its backend "" at the top, as before backends, and every backend under ``backends``."""
    backends = [describe(h, registered) for h in healths]
    only = next((b for b in backends if b["backend"] == ""), None) or describe(ModuleHealth(module=module), registered)
    top = {key: value for key, value in only.items() if key not in ("backend", "name")}
    return {**top, "backends": backends}


def health_answer(module: str) -> dict[str, Any]:
    return describe_module(module, outages.backends_of([module])[module], set(registry.modules()))


def backend_answer(module: str, backend: str) -> dict[str, Any]:
    health = ModuleHealth.objects.filter(module=module, backend=backend).first()
    return describe(health or ModuleHealth(module=module, backend=backend), set(registry.modules()))


def known(name: str) -> str:
    if not outages.module_known(name):
        raise NotFound()
    return name


@extend_schema(
    tags=["modules"],
    summary="Every module, with the health of each of its backends",
    parameters=[IF_NONE_MATCH],
    responses={200: s.ModuleHealthSerializer(many=True), 304: NOT_MODIFIED, **errors()},
)
class ModuleListView(EventsAPI, APIView):
    """Needs `cleanup.view_modulehealth`. Every registered module and every module that was
    ever marked down, by name: up or down, since when, the last error, when it is probed
    next, of its backend "" at the top and of each backend in `backends`."""

    required_perms = {"GET": ["cleanup.view_modulehealth"]}
    pagination_class = None  # a handful of modules: the whole list at once

    def get(self, request: Request) -> Response:
        registered = set(registry.modules())
        known_modules = outages.known_modules()
        backends = outages.backends_of(known_modules)
        answer = [describe_module(m, backends[m], registered) for m in known_modules]
        return conditional(request, Response(s.ModuleHealthSerializer(answer, many=True).data), weak=True)


@extend_schema(
    tags=["modules"],
    summary="Mark a module down by hand: its work waits, spending no attempts",
    request=s.MarkDownSerializer,
    responses={200: s.ModuleHealthSerializer, **errors(400, 404, 409)},
)
class ModuleDownView(EventsAPI, APIView):
    """Needs `cleanup.cleanup_run`. Marks the module's backend "" (its only one): its ledger
    rows and steps are not attempted until a probe finds it answering or a person marks it
    up. Logged (`module.down`) with the reason and the actor; a module already down answers
    409 and nothing changes. Another backend: `modules/{name}/backends/{backend}/down/`."""

    required_perms = {"POST": ["cleanup.cleanup_run"]}

    def post(self, request: Request, name: str) -> Response:
        body = s.MarkDownSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        known(name)
        data = body.validated_data
        if not outages.mark_down(name, by=actor(request), reason=data["reason"].strip(), until=data["until"]):
            raise Conflict("already_down", f"module {name} is already down")
        return Response(s.ModuleHealthSerializer(health_answer(name)).data)


@extend_schema(
    tags=["modules"],
    summary="Mark a module up by hand: its waiting work resumes",
    request=None,
    responses={200: s.ModuleHealthSerializer, **errors(400, 404, 409)},
)
class ModuleUpView(EventsAPI, APIView):
    """Needs `cleanup.cleanup_run`. Marks the module's backend "" up: its waiting rows are
    spread over a few seconds. Logged (`module.up`) with the actor; a module already up
    answers 409 and nothing changes. Another backend: `modules/{name}/backends/{backend}/up/`."""

    required_perms = {"POST": ["cleanup.cleanup_run"]}

    def post(self, request: Request, name: str) -> Response:
        s.EmptySerializer(data=request.data).is_valid(raise_exception=True)
        known(name)
        if not outages.mark_up(name, by=actor(request)):
            raise Conflict("already_up", f"module {name} is already up")
        return Response(s.ModuleHealthSerializer(health_answer(name)).data)


@extend_schema(
    tags=["modules"],
    summary="Mark one backend of a module down by hand: its work waits, spending no attempts",
    request=s.MarkDownSerializer,
    parameters=[BACKEND_PATH],
    responses={200: s.BackendHealthSerializer, **errors(400, 404, 409)},
)
class BackendDownView(EventsAPI, APIView):
    """Needs `cleanup.cleanup_run`. That backend's ledger rows and steps are not attempted
    until a probe finds it answering or a person marks it up; the module's other backends
    are worked as usual. A backend never seen has its health row made. Logged
    (`module.down`, with the backend) with the reason and the actor; a backend already down
    answers 409 and nothing changes."""

    required_perms = {"POST": ["cleanup.cleanup_run"]}

    def post(self, request: Request, name: str, backend: str) -> Response:
        body = s.MarkDownSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        backend_checked(backend)
        known(name)
        reason, until = body.validated_data["reason"].strip(), body.validated_data["until"]
        if not outages.mark_down(name, backend=backend, by=actor(request), reason=reason, until=until):
            raise Conflict("already_down", f"backend {name}/{backend} is already down")
        return Response(s.BackendHealthSerializer(backend_answer(name, backend)).data)


@extend_schema(
    tags=["modules"],
    summary="Mark one backend of a module up by hand: its waiting work resumes",
    request=None,
    parameters=[BACKEND_PATH],
    responses={200: s.BackendHealthSerializer, **errors(400, 404, 409)},
)
class BackendUpView(EventsAPI, APIView):
    """Needs `cleanup.cleanup_run`. Its waiting rows are spread over a few seconds. Logged
    (`module.up`, with the backend) with the actor; a backend already up (or never seen)
    answers 409 and nothing changes."""

    required_perms = {"POST": ["cleanup.cleanup_run"]}

    def post(self, request: Request, name: str, backend: str) -> Response:
        s.EmptySerializer(data=request.data).is_valid(raise_exception=True)
        backend_checked(backend)
        known(name)
        if not outages.mark_up(name, backend=backend, by=actor(request)):
            raise Conflict("already_up", f"backend {name}/{backend} is already up")
        return Response(s.BackendHealthSerializer(backend_answer(name, backend)).data)


@extend_schema(
    tags=["modules"],
    summary="The modules' log: each backend went down, came back, or had its waiting work given up",
    parameters=[OpenApiParameter("module", str, description="Only this module's entries."), BACKEND_PARAM],
    responses={200: s.ModuleEventSerializer(many=True), **errors(400, 404)},
)
class ModuleLogView(EventsAPI, generics.ListAPIView[ModuleEvent]):
    """Needs `cleanup.view_moduleevent`. Newest first."""

    serializer_class = s.ModuleEventSerializer
    default_ordering = "-at"
    required_perms = {"GET": ["cleanup.view_moduleevent"]}
    filters = ("module", "backend")

    def get_queryset(self) -> QuerySet[ModuleEvent]:
        entries = ModuleEvent.objects.order_by("-at", "-id")
        module = self.request.query_params.get("module")
        if module is not None:
            # As the ledger's filter: no module's name holds a NUL (PostgreSQL refuses one
            # in a query), so the answer is an empty list, not an error for a valid string.
            entries = entries.none() if "\x00" in module else entries.filter(module=module)
        return by_backend(entries, self.request.query_params)


@extend_schema(
    tags=["modules"],
    summary="One module's log",
    parameters=[BACKEND_PARAM],
    responses={200: s.ModuleEventSerializer(many=True), **errors(404)},
)
class ModuleOneLogView(EventsAPI, generics.ListAPIView[ModuleEvent]):
    """Needs `cleanup.view_moduleevent`. Newest first; a module never known answers 404."""

    serializer_class = s.ModuleEventSerializer
    default_ordering = "-at"
    required_perms = {"GET": ["cleanup.view_moduleevent"]}
    filters = ("backend",)

    @extend_schema(operation_id="events_module_log_list")
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[ModuleEvent]:
        name = self.kwargs["name"]
        if not (outages.module_known(name) or ModuleEvent.objects.filter(module=name).exists()):
            raise NotFound()
        return by_backend(ModuleEvent.objects.filter(module=name).order_by("-at", "-id"), self.request.query_params)
