"""The admin's building blocks: what needs a person, and lists that never count a whole table.

`attention` gives the counts the admin index leads with, as the ledger row's owner
(`cleanup.rows`) defines them; every query behind it reads the partial indexes of
unresolved rows only. The paginator, the filters and `ReadOnlyAdmin`
keep each list bounded: counts are capped, filter choices are fixed or read from the
registry and the unresolved rows, and no page can save a row.

May import models, conf, `cleanup.rows`, registry and outages, never another module of the admin; the
admin's pages and the template tags import it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from types import ModuleType
from typing import TYPE_CHECKING, Any, NotRequired, Protocol, TypedDict, cast

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest, HttpResponseBase
from django.urls import URLPattern, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html
from django.utils.http import urlencode
from django.utils.safestring import SafeString
from django.utils.text import slugify

from .. import rows as ledger_rows
from ..conf import max_revert_attempts
from ..models import (
    TERMINAL,
    UNRESOLVED,
    LogKind,
    ModuleHealth,
    Resource,
    ResourceState,
    Run,
    RunStatus,
    Step,
    StepStatus,
)
from ..rows import ended_unresolved

if TYPE_CHECKING:
    from django.contrib.admin.options import _ListDisplayT

    # The mixins below are mixed into model admins: to the checker they are one. Any model:
    # one mixin serves the admins of several models.
    _ModelAdminBase = admin.ModelAdmin[Any]
else:
    _ModelAdminBase = object

# A changelist filter's choices: (value in the query string, what a person reads).
Choices = list[tuple[str, str]]


class User(Protocol):
    """Who asks for the counts: a signed-in user or the anonymous one."""

    def has_perm(self, perm: str, obj: Model | None = None) -> bool: ...


class Oldest(TypedDict):
    id: int
    at: str
    age: str


class BackendDown(TypedDict):
    name: str
    id: str
    since: str
    error: str
    rows: int
    link: str


class Attention(TypedDict):
    """The counts the admin index leads with: each only where the user may see it."""

    running_runs: NotRequired[int]
    incomplete_runs: NotRequired[int]
    left_runs: NotRequired[int]
    modules_down: NotRequired[int]
    backends_down: NotRequired[list[BackendDown]]
    retrying: NotRequired[int]
    waiting: NotRequired[int]
    left: NotRequired[int]
    oldest: NotRequired[Oldest]


def actor(request: HttpRequest) -> str:
    """Who asked, as the engine records it (the run log, the modules' log)."""
    return request.user.get_username()


def when(dt: datetime | None) -> str:
    """A time to the second with its date and the site's time zone, or a dash."""
    if dt is None:
        return "-"
    return timezone.localtime(dt).strftime("%Y-%m-%d %H:%M:%S %Z")


def utc_when(dt: datetime | None) -> str:
    """The same moment in UTC, for the hover of a time shown in the site's zone."""
    if dt is None:
        return "-"
    return dt.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def short_when(dt: datetime | None) -> str:
    """A time as short as a list can show it and still dated: ``12-03 21:04:05 UTC``."""
    if dt is None:
        return "-"
    return timezone.localtime(dt).strftime("%m-%d %H:%M:%S %Z")


def ago(seconds: float) -> str:
    whole = int(seconds)
    if whole < 120:
        return f"{whole} s"
    if whole < 7200:
        return f"{whole // 60} min"
    if whole < 172800:
        return f"{whole // 3600} h"
    return f"{whole // 86400} days"


# -- what needs a person ----------------------------------------------------------------


def retrying_q(now: datetime, max_attempts: int) -> Q:
    """Unresolved rows the automatic sweep will still try (`rows.retrying`)."""
    return ledger_rows.retrying(now, max_attempts)


def waiting_q(now: datetime, max_attempts: int) -> Q:
    """Unresolved rows the automatic sweep gave up on (`rows.gave_up`); the rows a person
    left for later are counted apart (`rows.left_for_later`)."""
    return ledger_rows.gave_up(now, max_attempts)


def attention(user: User) -> Attention:
    """The counts the admin index leads with; each reads unresolved rows only (partial indexes)."""
    found: Attention = {}
    if user.has_perm("cleanup.view_run"):
        found["running_runs"] = Run.objects.filter(status=RunStatus.RUNNING).count()
        found["incomplete_runs"] = Run.objects.filter(cleanup_status="incomplete").count()
        found["left_runs"] = Run.objects.filter(cleanup_status="left").count()
    if user.has_perm("cleanup.view_modulehealth"):
        found["modules_down"] = ModuleHealth.objects.down().count()
        if found["modules_down"] and user.has_perm("cleanup.view_resource") and site_backends():
            found["backends_down"] = backends_down()
    if user.has_perm("cleanup.view_resource"):
        max_attempts, now = max_revert_attempts(), timezone.now()
        rows = ended_unresolved()
        found["retrying"] = rows.filter(retrying_q(now, max_attempts)).count()
        found["waiting"] = rows.filter(waiting_q(now, max_attempts)).count()
        found["left"] = rows.filter(ledger_rows.left_for_later()).count()
        oldest = rows.order_by("created_at", "id").values("id", "created_at").first()
        if oldest:
            found["oldest"] = {
                "id": oldest["id"],
                "at": when(oldest["created_at"]),
                "age": ago((timezone.now() - oldest["created_at"]).total_seconds()),
            }
    return found


def backends_down() -> list[BackendDown]:
    """Each backend down, with its unresolved rows counted and the ledger's list of them."""
    found: list[BackendDown] = []
    for health in ModuleHealth.objects.down().order_by("module", "backend"):
        rows = Resource.objects.filter(state__in=UNRESOLVED, module=health.module, backend=health.backend)
        found.append(
            {
                "name": health.name,
                "id": "count-down-" + slugify(health.name.replace("/", " ")),
                "since": when(health.down_since),
                "error": health.last_error,
                "rows": rows.count(),
                "link": filtered(
                    "resource", needs="unresolved", module=health.module, backend=backend_param(health.backend)
                ),
            }
        )
    return found


# -- lists that never count a whole table -------------------------------------------------


class CappedPaginator(Paginator):  # type: ignore[type-arg]  # pages of any model's rows
    """Counts at most ``CAP`` rows: past it, the last page is "more" rather than a number."""

    CAP = 10_000

    @cached_property
    def count(self) -> int:
        rows = cast("QuerySet[Any]", self.object_list)  # the admin's lists page querysets
        return rows.order_by().values("pk")[: self.CAP].count()


class BoundedListMixin(_ModelAdminBase):
    paginator = CappedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 100


class NeedsFilter(admin.SimpleListFilter):
    title = "needs"
    parameter_name = "needs"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> Choices:
        return [
            ("unresolved", "unresolved"),
            ("retrying", "retrying (attempts left)"),
            ("waiting", "waiting for a person"),
            ("left", "left for later"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        max_attempts, now = max_revert_attempts(), timezone.now()
        if self.value() == "unresolved":
            return queryset.filter(state__in=UNRESOLVED)
        if self.value() == "retrying":
            return ended_unresolved(queryset).filter(retrying_q(now, max_attempts))
        if self.value() == "waiting":
            return ended_unresolved(queryset).filter(waiting_q(now, max_attempts))
        if self.value() == "left":
            return ended_unresolved(queryset).filter(ledger_rows.left_for_later())
        return queryset


class RegistryFilter(admin.SimpleListFilter):
    """Choices from the module registry and the unresolved rows, never a DISTINCT of the ledger."""

    field = ""

    def registered(self) -> Iterable[str]:
        """The values the registry knows of."""
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> Choices:
        values = set(self.registered())
        values |= set(
            Resource.objects.filter(state__in=UNRESOLVED).order_by().values_list(self.field, flat=True).distinct()[:50]
        )
        if value := self.value():
            values.add(value)
        return [(v, v) for v in sorted(values)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(**{self.field: self.value()}) if self.value() else queryset


class ModuleFilter(RegistryFilter):
    title = parameter_name = field = "module"

    def registered(self) -> Iterable[str]:
        from .. import registry

        return registry.modules()


class KindFilter(RegistryFilter):
    title = parameter_name = field = "kind"

    def registered(self) -> Iterable[str]:
        return ["step", "override"]


# -- backends: shown where the site has more than one backend to a module ---------------

BACKEND_CHOICES = 50


def site_backends(request: HttpRequest | None = None) -> list[str]:
    """The backends other than ``""`` the site knows, sorted: those with a health row (every
    backend that was watched, probed, blamed or marked) and those of unresolved rows, capped.

    Never a DISTINCT of the whole ledger. Empty on a site whose modules have one backend
    each: its pages show no backend at all, exactly as before backends existed. Read once
    per request.
    """
    cached: list[str] | None = getattr(request, "_cleanup_backends", None)
    if cached is not None:
        return cached
    names = set(ModuleHealth.objects.exclude(backend="").order_by().values_list("backend", flat=True).distinct())
    names |= set(
        Resource.objects.filter(state__in=UNRESOLVED)
        .exclude(backend="")
        .order_by()
        .values_list("backend", flat=True)
        .distinct()[:BACKEND_CHOICES]
    )
    found = sorted(names)
    if request is not None:
        request._cleanup_backends = found  # type: ignore[attr-defined]  # read once per request
    return found


def with_backend(columns: Iterable[Any], request: HttpRequest, after: str) -> list[Any]:
    """``columns`` with the backend's column after ``after``, when the site has backends.

    A column is a name or a callable, as Django's ``list_display`` takes them."""
    shown = list(columns)
    if site_backends(request) and "backend_shown" not in shown:
        shown.insert(shown.index(after) + 1, "backend_shown")
    return shown


def backend_text(backend: str) -> str:
    return backend or "-"


# No backend's name holds a "/" (`cleanup.calls.backend_name_ok`): in the filter, it stands
# for a module's only backend, "".
ONLY_BACKEND = "/"


def backend_param(backend: str) -> str:
    """The value of the ``backend`` filter that lists ``backend``'s objects."""
    return backend or ONLY_BACKEND


class BackendFilter(admin.SimpleListFilter):
    """Fixed choices from `site_backends`, and "-" for a module's only backend; hidden on a
    site whose modules have one backend each."""

    title = parameter_name = "backend"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> Choices:
        values = set(site_backends(request))
        if not values:
            return []
        if (value := self.value()) and value != ONLY_BACKEND:
            values.add(value)
        return [(ONLY_BACKEND, "- (a module's only backend)"), *[(v, v) for v in sorted(values)]]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        return queryset.filter(backend="" if self.value() == ONLY_BACKEND else self.value())


class BackendColumnMixin(_ModelAdminBase):
    """A model admin whose objects have a ``backend``: the column and the detail field shown
    where the site has backends (`site_backends`), or the object names one."""

    backend_after: str = ""

    def get_list_display(self, request: HttpRequest) -> _ListDisplayT[Any]:
        return with_backend(super().get_list_display(request), request, self.backend_after)

    @admin.display(description="backend")
    def backend_shown(self, obj: Any) -> str:  # a model with a ``backend``
        return backend_text(obj.backend)

    def shows_backend(self, request: HttpRequest, obj: Any) -> bool:  # None, or a model with a ``backend``
        return bool(site_backends(request) or (obj is not None and obj.backend))


class LogKindFilter(admin.SimpleListFilter):
    """Every kind of log entry, read from `LogKind` so that a new kind is offered at once."""

    title = "kind"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin[Any]) -> Choices:
        return LogKind.choices

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(kind=self.value()) if self.value() else queryset


def permission_first(
    model_admin: admin.ModelAdmin[Any], view: Callable[..., HttpResponseBase], needs_add: bool = False
) -> Callable[..., HttpResponseBase]:
    """``view``, refused with 403 before it runs unless the user may see the model's pages
    (who is not signed in as staff is sent to the login page, as everywhere in the admin).

    Django's own views check their permission, but only once they are running: a page that
    reads rows or calls a module before handing over to them (a run's page, module
    health) would work for a user it then refuses. Checked first, a refused request makes
    no query of the app's tables and no module call.
    """

    @functools.wraps(view)
    def gated(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        if not model_admin.admin_site.has_permission(request):
            # Not signed in as active staff: the admin's own wrapper sends them to the login
            # page (with ``next``) before anything of the view runs, as on Django's own pages.
            return view(request, *args, **kwargs)
        allowed = (
            model_admin.has_add_permission(request) if needs_add else model_admin.has_view_or_change_permission(request)
        )
        if not allowed:
            raise PermissionDenied
        return view(request, *args, **kwargs)

    return gated


class PermissionFirstMixin(_ModelAdminBase):
    """Every page of the model admin checks its permission before its view runs (`permission_first`):
    the add page its add permission, every other page (lists, a row's page, its history, the
    admin's own pages such as a mark-down) the model's view permission, before its own checks."""

    def get_urls(self) -> list[URLPattern]:
        urls = super().get_urls()
        add = f"{self.opts.app_label}_{self.opts.model_name}_add"
        for pattern in urls:
            if isinstance(pattern, URLPattern):
                gated = permission_first(self, pattern.callback, needs_add=pattern.name == add)
                pattern.callback = gated
        return urls


class ReadOnlyAdmin(PermissionFirstMixin, BoundedListMixin, admin.ModelAdmin):  # type: ignore[type-arg]  # any model
    """Pages without Save: nothing here rewrites a row (or leaves an empty history entry);
    every page checks its permission before any work (`PermissionFirstMixin`)."""

    # ``obj``: an object of whichever model the admin shows.
    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class PersonActionsAdmin(ReadOnlyAdmin):
    """A read-only page whose actions are a person's, gated by ``cleanup.cleanup_run``.

    Bulk deletion is never offered: deleting a run deletes its ledger, and a ledger row
    or a module's health is not a thing to delete.
    """

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def has_cleanup_run_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("cleanup.cleanup_run")


def run_link(run_id: int, name: str | None = None) -> SafeString:
    # The whole name, wrapping in its cell: names that share a start are told apart by their end.
    label = f"#{run_id} {name}" if name else f"#{run_id}"
    return format_html('<a href="{}">{}</a>', reverse("admin:cleanup_run_change", args=[run_id]), label)


def filtered(model: str, **params: str | int) -> str:
    return reverse(f"admin:cleanup_{model}_changelist") + "?" + urlencode(params)


def attempt_text(row: Resource, max_attempts: int, now: datetime) -> str:
    """Where a row stands with its attempts, as a person reads it."""
    n = row.revert_attempts
    if row.state == ResourceState.REVERTED:
        return f"given back (attempt {n})" if n else "given back"
    if row.state == ResourceState.WAIVED:
        return "waived"
    if row.state == ResourceState.ORPHANED:
        return "gone from the world"
    if row.state == ResourceState.DRIFTED:
        return "drifted: waiting for a person"
    if row.state == ResourceState.REVERTING:
        return f"attempt {n} of {max_attempts}, in progress"
    if row.run.status not in TERMINAL:
        return "held by a running run"
    # A row's last verdict is when it gave up: it is written with the row's updated_at.
    at = f" at {short_when(row.updated_at)}" if getattr(row, "updated_at", None) else ""
    if not row.retryable:
        return f"given up after {n} (not retryable){at}"
    if not ledger_rows.holds(row, ledger_rows.attempts_left(max_attempts)):
        return f"given up after {n} of {max_attempts}{at}"
    if not row.run.auto_cleanup:
        return "waiting for a person (cancelled without cleanup)"
    if getattr(row, "waiting", None):
        return f"attempt {n} of {max_attempts}; none spent while it waits"
    if row.next_attempt_at and row.next_attempt_at > now:
        return f"attempt {n} of {max_attempts}; next in {ago((row.next_attempt_at - now).total_seconds())}"
    return f"attempt {n} of {max_attempts}; next pass" if n else f"not tried yet (of {max_attempts})"


def state_shown(row: Resource) -> tuple[str, str, str]:
    """A row's state as a person reads it: ``(css class, word, line under it or "")``.

    A row waiting for its backend reads "waiting", with why and since when on a line of
    its own (set by `mark_waiting`), never "failed"; a running run's rows are "held".
    """
    waiting = getattr(row, "waiting", None)
    if waiting:
        return "state-waiting", "waiting", waiting
    if row.state == ResourceState.LIVE and row.run.status not in TERMINAL:
        return "state-held", "live", "held by its running run"
    return f"state-{row.state}", row.get_state_display(), ""


def next_attempt(row: Resource, max_attempts: int) -> datetime | None:
    """When the sweep will try the row again, or None: never for a row that waits for a person."""
    if not ledger_rows.holds(row, ledger_rows.awaits_sweep(max_attempts)):
        return None
    return row.next_attempt_at or row.run.ended_at or row.created_at


# -- work that waits on a module that is down -------------------------------------------


def mark_waiting(rows: Iterable[Resource], max_attempts: int) -> list[Resource]:
    """Set ``row.waiting`` to "waiting: <module>[/<backend>] is down since …" on rows held by
    an outage of their own backend.

    One query for the whole page (`cleanup.outages.waiting_reasons`), not one per row.
    """
    from .. import outages

    shown = list(rows)
    reasons: dict[Any, str] = outages.waiting_reasons({(r.module, r.backend) for r in shown}) if shown else {}
    waits = ledger_rows.awaits_sweep(max_attempts)
    for row in shown:
        row.waiting = reasons.get((row.module, row.backend)) if ledger_rows.holds(row, waits) else None
    return shown


def mark_steps_waiting(steps: Sequence[Step]) -> Sequence[Step]:
    """Set ``step.waiting`` on the steps not yet done whose backend is down; one query for them all."""
    from .. import outages, registry

    open_steps = [s for s in steps if s.status in (StepStatus.PENDING, StepStatus.RUNNING)]
    keys = {s: (module, s.backend) for s in open_steps if (module := step_module(s, registry))}
    reasons: dict[Any, str] = outages.waiting_reasons(set(keys.values())) if keys else {}
    for step in steps:
        step.waiting = reasons.get(keys.get(step))
    return steps


def step_module(step: Step, registry: ModuleType) -> str | None:
    """The module a step calls, or None (a built-in wait, an unregistered action)."""
    if step.action_id == "core.lease":
        entry = registry.get_lease((step.params or {}).get("lease")) if isinstance(step.params, dict) else None
    else:
        entry = registry.get_action(step.action_id)
    module: str | None = getattr(entry, "module", None)
    return module
