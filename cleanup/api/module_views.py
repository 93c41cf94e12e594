"""The API's module endpoints: each module's backend health, marking it down or up, and their log.

Each view is a few lines over `cleanup.outages`. Marking answers the module's new state,
or 409 when it already is in the state asked for (nothing changes, nothing is logged).
May import: `outages`, `registry`, the models and the API's own modules.
"""

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from .. import outages, registry
from ..models import ModuleEvent, ModuleState
from . import serializers as s
from .views import Conflict, EventsAPI, actor, errors


def health_answer(module):
    return describe(outages.health_rows([module])[module], set(registry.modules()))


def describe(health, registered):
    down = health.state == ModuleState.DOWN
    return {
        "module": health.module,
        "registered": health.module in registered,
        "state": health.state,
        "since": health.down_since if down else None,
        "last_error": health.last_error,
        "failures_in_row": health.failures_in_row,
        "next_probe_at": health.next_probe_at if down else None,
        "changed_by": health.changed_by,
        "waiting": health.waiting_text() if down else None,
    }


def known(name):
    if not outages.module_known(name):
        raise NotFound()
    return name


@extend_schema(
    tags=["modules"],
    summary="Every module, with its backend's health",
    responses={200: s.ModuleHealthSerializer(many=True), **errors()},
)
class ModuleListView(EventsAPI, APIView):
    """Needs `cleanup.view_modulehealth`. Every registered module and every module that was
    ever marked down, by name: up or down, since when, the last error, when it is probed next."""

    required_perms = {"GET": ["cleanup.view_modulehealth"]}
    pagination_class = None  # a handful of modules: the whole list at once

    def get(self, request):
        registered = set(registry.modules())
        healths = outages.health_rows(outages.known_modules())
        answer = [describe(health, registered) for health in healths.values()]
        return Response(s.ModuleHealthSerializer(answer, many=True).data)


@extend_schema(
    tags=["modules"],
    summary="Mark a module down by hand: its work waits, spending no attempts",
    request=s.MarkDownSerializer,
    responses={200: s.ModuleHealthSerializer, **errors(400, 404, 409)},
)
class ModuleDownView(EventsAPI, APIView):
    """Needs `cleanup.cleanup_run`. Its ledger rows and steps are not attempted until a probe
    finds it answering or a person marks it up. Logged (`module.down`) with the reason and
    the actor; a module already down answers 409 and nothing changes."""

    required_perms = {"POST": ["cleanup.cleanup_run"]}

    def post(self, request, name):
        body = s.MarkDownSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        known(name)
        if not outages.mark_down(name, by=actor(request), reason=body.validated_data["reason"].strip()):
            raise Conflict(f"module {name} is already down")
        return Response(s.ModuleHealthSerializer(health_answer(name)).data)


@extend_schema(
    tags=["modules"],
    summary="Mark a module up by hand: its waiting work resumes",
    request=None,
    responses={200: s.ModuleHealthSerializer, **errors(400, 404, 409)},
)
class ModuleUpView(EventsAPI, APIView):
    """Needs `cleanup.cleanup_run`. Its waiting rows are spread over a few seconds. Logged
    (`module.up`) with the actor; a module already up answers 409 and nothing changes."""

    required_perms = {"POST": ["cleanup.cleanup_run"]}

    def post(self, request, name):
        s.EmptySerializer(data=request.data).is_valid(raise_exception=True)
        known(name)
        if not outages.mark_up(name, by=actor(request)):
            raise Conflict(f"module {name} is already up")
        return Response(s.ModuleHealthSerializer(health_answer(name)).data)


@extend_schema(
    tags=["modules"],
    summary="The modules' log: each went down, came back, or had its waiting work given up",
    parameters=[OpenApiParameter("module", str, description="Only this module's entries.")],
    responses={200: s.ModuleEventSerializer(many=True), **errors(400, 404)},
)
class ModuleLogView(EventsAPI, generics.ListAPIView):
    """Needs `cleanup.view_moduleevent`. Newest first."""

    serializer_class = s.ModuleEventSerializer
    required_perms = {"GET": ["cleanup.view_moduleevent"]}

    def get_queryset(self):
        entries = ModuleEvent.objects.order_by("-at", "-id")
        module = self.request.query_params.get("module")
        if module is not None:
            # As the ledger's filter: no module's name holds a NUL (PostgreSQL refuses one
            # in a query), so the answer is an empty list, not an error for a valid string.
            entries = entries.none() if "\x00" in module else entries.filter(module=module)
        return entries


@extend_schema(
    tags=["modules"], summary="One module's log", responses={200: s.ModuleEventSerializer(many=True), **errors(404)}
)
class ModuleOneLogView(EventsAPI, generics.ListAPIView):
    """Needs `cleanup.view_moduleevent`. Newest first; a module never known answers 404."""

    serializer_class = s.ModuleEventSerializer
    required_perms = {"GET": ["cleanup.view_moduleevent"]}

    @extend_schema(operation_id="events_module_log_list")
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        name = self.kwargs["name"]
        if not (outages.module_known(name) or ModuleEvent.objects.filter(module=name).exists()):
            raise NotFound()
        return ModuleEvent.objects.filter(module=name).order_by("-at", "-id")
