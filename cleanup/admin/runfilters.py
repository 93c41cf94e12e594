"""The runs' list filters beyond status: by backend, by who started them, by date.

Each reads what is bounded: a backend's choices are the site's (`lists.site_backends`), a
run's backends are its steps' (an EXISTS per run, on the steps' (run, position) index);
who started runs is read from the newest runs only, never a DISTINCT of the whole table.
May import models and `.lists`; the runs' admin imports it.
"""

from typing import Any

from django.contrib import admin
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest

from ..models import Run, Step
from .lists import ONLY_BACKEND, BackendFilter

# How many of the newest runs the "started by" choices are read from, and how many are offered.
STARTERS_FROM = 5_000
STARTERS_SHOWN = 50


class RunBackendFilter(BackendFilter):
    """Runs with a step on the backend chosen."""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        backend = "" if self.value() == ONLY_BACKEND else self.value()
        return queryset.filter(Exists(Step.objects.filter(run=OuterRef("pk"), backend=backend)))


class StartedByFilter(admin.SimpleListFilter):
    """Who started the run (the actor `start_run` was given: a person, the console, a command)."""

    title = "started by"
    parameter_name = "started_by"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        recent = Run.objects.order_by("-id").values_list("started_by", flat=True)[:STARTERS_FROM]
        names = sorted({name for name in recent if name})[:STARTERS_SHOWN]
        if self.value() and self.value() not in names:
            names.append(str(self.value()))
        return [(name, name) for name in names]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(started_by=self.value()) if self.value() else queryset
