"""The admin's module pages: each backend's health, marking one down or up by hand, and their log.

A module serves one backend or many (a fleet of shards); each backend has its own health
row. The engine marks a backend down after answers that blame it, and up when a probe
finds it answering; a person can do either here (`cleanup.outages.mark_down`, `mark_up`),
one backend at a time, behind the `cleanup.cleanup_run` permission, and is recorded in the
modules' log and in the admin's recent actions. A backend never seen failing may have no
health row yet: it is listed apart, and marking it down makes its row (through `outages`,
never by hand). Work waiting on a down backend shows why on the ledger and run pages
(`mark_waiting` in `cleanup.admin.lists`). May import the engine (outages), calls (a
backend's name), registry, validation, `security` (what its live rows are to the idle clock),
`skew` (the clusters' clocks, shown under the list), models, `.lists` and `.livelist`;
nothing imports it but the package. Its list stays current as the ledger's does
(``modulehealth/live/``, read again by ``cleanup/static/cleanup/live.js``).
"""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.defaultfilters import pluralize, truncatechars
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString

from .. import calls, deadman, outages, registry, skew, validation
from ..models import UNRESOLVED, ModuleEvent, ModuleHealth, ModuleState, Resource
from .lists import (
    ONLY_BACKEND,
    BackendColumnMixin,
    BackendFilter,
    PersonActionsAdmin,
    ReadOnlyAdmin,
    actor,
    ago,
    backend_param,
    filtered,
    short_when,
    site_backends,
    when,
)
from .livelist import LiveListMixin

ERROR_CHARS = 90
BOOT_CHARS = 20


class MarkDownForm(forms.Form):
    reason = forms.CharField(
        max_length=validation.MAX_REASON,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Why the backend is out (a deploy, a crash): shown beside every row and step that waits.",
    )
    until = forms.DateTimeField(
        required=False,
        help_text="When the hold ends by itself (YYYY-MM-DD HH:MM). Empty: the backend stays down until a "
        "person marks it up; probes only say what they see.",
    )

    def clean_until(self) -> datetime | None:
        until: datetime | None = self.cleaned_data.get("until")
        if until is not None and until <= timezone.now():
            raise forms.ValidationError("The hold must end in the future.")
        return until

    def clean_reason(self) -> str:
        reason: str = self.cleaned_data["reason"]
        if message := validation.text_error(reason, validation.MAX_REASON):
            raise forms.ValidationError(f"The reason {message}.")
        return reason.strip()


@admin.register(ModuleHealth)
class ModuleHealthAdmin(LiveListMixin, BackendColumnMixin, PersonActionsAdmin):
    # The list stays current: its rows' states, reasons and held rows as they are now.
    live_url_name = "cleanup_modulehealth_live"
    live_template = "admin/cleanup/modulehealth/live.html"
    live_refused = "These filters are not module health's."
    # The state first, with since when, why and who beside it in its one cell, so that a
    # person sees the reason at 1,280 px without scrolling; the rest after it.
    list_display = [
        "module",
        "health_shown",
        "boot",
        "owed",
        "next_probe",
        "failures_in_row",
        "switch",
    ]
    list_filter = ["state", BackendFilter]
    search_fields = ["module", "backend"]
    ordering = ["module", "backend"]
    actions = ["mark_down", "mark_up"]
    backend_after = "module"
    change_list_template = "admin/cleanup/modulehealth/change_list.html"
    fields = (
        "module",
        "state_shown",
        "since",
        "last_error",
        "next_probe",
        "failures_in_row",
        "changed_by",
        "gave_up",
        "updated",
        "boot_id",
        "watched",
        "owed",
        "restarts_seen",
        "waiting",
        "switch",
    )
    readonly_fields = [*fields, "backend_shown"]

    def get_fields(self, request: HttpRequest, obj: ModuleHealth | None = None) -> tuple[str, ...]:
        fields = [str(name) for name in self.fields or ()]
        if self.shows_backend(request, obj):
            fields.insert(fields.index("module") + 1, "backend_shown")
        return tuple(fields)

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view(self.mark_backend_down)
        view.model_admin = self  # type: ignore[attr-defined]  # the input guard checks its query as any page's of this admin
        urls: list[URLPattern] = super().get_urls()
        return [path("mark-down/", view, name="cleanup_modulehealth_mark_down"), *self.live_urls(), *urls]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        # Every registered module is listed, so that one never seen failing can be marked down too.
        ModuleHealth.objects.bulk_create([ModuleHealth(module=m) for m in registry.modules()], ignore_conflicts=True)
        extra = {
            "unseen": self.unseen_backends(request),
            "can_mark": self.has_cleanup_run_permission(request),
            # The list stays current as the ledger's does (`cleanup.admin.livelist`).
            "live_src": self.live_src(request),
            # Each cluster's clock against the database's (`cleanup.skew`): decisions use the
            # database's, so an offset moves only log times; flagged past 5 s.
            "worker_clocks": [(skew.line(r), abs(r.offset_s) > skew.WARN_S) for r in skew.readings()],
            "clock_warn_s": skew.WARN_S,
        }
        return super().changelist_view(request, {**extra, **(extra_context or {})})

    def unseen_backends(self, request: HttpRequest) -> list[ModuleHealth]:
        """The backends of the known modules that hold unresolved rows but have no health row
        yet (never seen failing: up), as the list's filters and search would narrow them."""
        if request.GET.get("state__exact") == ModuleState.DOWN:
            return []
        wanted = request.GET.get("backend")
        search = request.GET.get("q", "").strip().lower()
        unseen: list[ModuleHealth] = []
        for healths in outages.backends_of(outages.known_modules()).values():
            for health in healths:
                if health.pk is not None or not health.backend:
                    continue
                if wanted and wanted != health.backend:
                    continue
                if search and search not in health.module.lower() and search not in health.backend.lower():
                    continue
                health.mark_down_link = mark_down_link(health.module, health.backend)
                unseen.append(health)
        return sorted(unseen, key=lambda h: (h.module, h.backend))

    @admin.display(description="state", ordering="state")
    def state_shown(self, obj: ModuleHealth) -> SafeString:
        log = format_html(' <a href="{}" class="health-log">its log</a>', module_log_link(obj))
        if obj.state != ModuleState.DOWN:
            return format_html('<span class="health-up">up</span>{}', log)
        now = timezone.now()
        lasted = f" for {ago((now - obj.down_since).total_seconds())}" if obj.down_since else ""
        down = format_html('<strong class="health-down">down{}</strong>{}', lasted, log)
        if not obj.held_at(now):
            return down
        until = f" until {when(obj.held_until)}" if obj.held_until else " until a person marks it up"
        probe = f"; the last probe {when(obj.last_probe_at)}: {obj.last_probe}" if obj.last_probe else ""
        return format_html("{}<br><small>held by {}{}{}</small>", down, obj.changed_by, until, probe)

    @admin.display(description="state: since when, why, who", ordering="state")
    def health_shown(self, obj: ModuleHealth) -> SafeString:
        """The state, since when, the reason and who changed it, and for a backend down the
        rows it holds, in one cell: the list's first column after the module's name."""
        parts = [self.state_shown(obj)]
        if obj.state == ModuleState.DOWN:
            if obj.down_since:
                parts.append(format_html('<span class="health-since">since {}</span>', when(obj.down_since)))
            if obj.last_error:
                parts.append(format_html('<span class="health-why">why: {}</span>', obj.last_error))
            if obj.changed_by:
                parts.append(format_html('<span class="health-who">by {}</span>', obj.changed_by))
            parts.append(held_rows_link(obj))
        elif obj.last_error:
            parts.append(format_html('<span class="health-why">{}</span>', self.error(obj)))
        return format_html_join("", '<div class="health-line">{}</div>', ((part,) for part in parts))

    @admin.display(description="down since", ordering="down_since")
    def since(self, obj: ModuleHealth) -> str:
        return str(when(obj.down_since)) if obj.state == ModuleState.DOWN else "-"

    @admin.display(description="last error")
    def error(self, obj: ModuleHealth) -> str:
        """The last error with its time; once the backend answers again, marked as old."""
        if not obj.last_error:
            return "-"
        short = truncatechars(obj.last_error, ERROR_CHARS)
        if obj.state == ModuleState.UP and not obj.failures_in_row:
            # A backend that answered again keeps its last error for the record, dated by the
            # answer that ended it (`outages.record` and `mark_up` write updated_at then).
            return format_html(
                '<span class="old-error" title="{}">before it answered again at {}: {}</span>',
                obj.last_error,
                when(obj.updated_at),
                short,
            )
        at = short_when(obj.updated_at)
        return format_html('<span title="{}">{}</span> <small>(at {})</small>', obj.last_error, short, at)

    @admin.display(description="boot id")
    def boot(self, obj: ModuleHealth) -> str:
        if not obj.boot_id:
            return "-"
        return format_html('<span title="{}">{}</span>', obj.boot_id, truncatechars(obj.boot_id, BOOT_CHARS))

    @admin.display(description="reconcile owed", ordering="reconcile_owed_since")
    def owed(self, obj: ModuleHealth) -> str:
        """A restart noticed and not yet reconciled (rule 14): since when, and whether a worker has it now."""
        if obj.reconcile_owed_since is None:
            return "-"
        now = timezone.now()
        taken = obj.reconcile_claim_expires_at is not None and obj.reconcile_claim_expires_at > now
        doing = " (being reconciled now)" if taken else ""
        return format_html(
            '<span class="reconcile-owed" title="{}">since {}{}</span>',
            obj.owed_text(),
            when(obj.reconcile_owed_since),
            doing,
        )

    @admin.display(description="dead-man's switch")
    def switch(self, obj: ModuleHealth) -> str:
        """The backend's switch (rule 34): armed, ttl, last renewal, what it holds, lapses."""
        return deadman.shown_text(obj.module, obj.backend)

    @admin.display(description="next probe")
    def next_probe(self, obj: ModuleHealth) -> str:
        return str(when(obj.next_probe_at)) if obj.state == ModuleState.DOWN else "-"

    @admin.display(description="work given up at")
    def gave_up(self, obj: ModuleHealth) -> str:
        return str(when(obj.gave_up_at))

    @admin.display(description="updated")
    def updated(self, obj: ModuleHealth) -> str:
        return str(when(obj.updated_at))

    @admin.display(description="health last asked")
    def watched(self, obj: ModuleHealth) -> str:
        return str(when(obj.watched_at))

    @admin.display(description="its work shows")
    def waiting(self, obj: ModuleHealth) -> str:
        return str(obj.waiting_text()) if obj.state == ModuleState.DOWN else "-"

    @admin.action(permissions=["cleanup_run"], description="Mark down… (its work waits, spending no attempts)")
    def mark_down(self, request: HttpRequest, queryset: QuerySet[ModuleHealth]) -> HttpResponse | None:
        """Asks for the reason first (an intermediate page), then marks each selected backend down."""
        healths = list(queryset.order_by("module", "backend"))
        form = MarkDownForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            return self.ask_reason(request, healths, form)
        reason, until = form.cleaned_data["reason"], form.cleaned_data["until"]
        changed = [
            h
            for h in healths
            if outages.mark_down(h.module, backend=h.backend, by=actor(request), reason=reason, until=until)
        ]
        self.record(request, changed, f"Marked down: {reason}")
        self._report(request, changed, healths, "down")
        return None

    @admin.action(permissions=["cleanup_run"], description="Mark up (its waiting work resumes)")
    def mark_up(self, request: HttpRequest, queryset: QuerySet[ModuleHealth]) -> None:
        healths = list(queryset.order_by("module", "backend"))
        changed = [h for h in healths if outages.mark_up(h.module, backend=h.backend, by=actor(request))]
        self.record(request, changed, "Marked up")
        self._report(request, changed, healths, "up")
        return None

    def mark_backend_down(self, request: HttpRequest) -> HttpResponse:
        """Mark one backend down by its module and name, whether or not it has a health row yet.

        ``?module=sandbox&backend=north`` (``backend`` empty for a module's only backend):
        asks for the reason, then `outages.mark_down`, which makes the row of a backend
        never seen.
        """
        if not (self.has_view_permission(request) and self.has_cleanup_run_permission(request)):
            raise PermissionDenied
        module = request.GET.get("module", "")
        backend = request.GET.get("backend", "")
        if backend == ONLY_BACKEND:
            backend = ""
        back = reverse("admin:cleanup_modulehealth_changelist")
        if not outages.module_known(module):
            self.message_user(request, f"No module is named {module[:100]!r}; nothing changed.", messages.ERROR)
            return HttpResponseRedirect(back)
        if not calls.backend_name_ok(backend):
            self.message_user(
                request,
                f"{backend[:100]!r} is not a backend's name (text of at most {calls.MAX_BACKEND} characters, "
                "without '/'); nothing changed.",
                messages.ERROR,
            )
            return HttpResponseRedirect(back)
        existing = ModuleHealth.objects.filter(module=module, backend=backend).first()
        health = existing or ModuleHealth(module=module, backend=backend)
        form = MarkDownForm(request.POST if request.method == "POST" else None)
        if not form.is_valid():
            return self.ask_reason(request, [health], form, one=True)
        reason, until = form.cleaned_data["reason"], form.cleaned_data["until"]
        changed = outages.mark_down(module, backend=backend, by=actor(request), reason=reason, until=until)
        health = ModuleHealth.objects.get(module=module, backend=backend)
        self.record(request, [health] if changed else [], f"Marked down: {reason}")
        self._report(request, [health] if changed else [], [health], "down")
        return HttpResponseRedirect(back)

    def ask_reason(
        self, request: HttpRequest, healths: Sequence[ModuleHealth], form: MarkDownForm, one: bool = False
    ) -> TemplateResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "modules": healths,
            "form": form,
            "one": one,
            "fleet": any(h.backend for h in healths),
            "title": f"Mark {healths[0].name} down" if one else "Mark modules down",
        }
        return TemplateResponse(request, "admin/cleanup/modulehealth/mark_down.html", context)

    def record(self, request: HttpRequest, healths: Sequence[ModuleHealth], message: str) -> None:
        """The admin's recent actions: each backend changed, named as it now stands ("sandbox/north: down")."""
        for health in healths:
            health.refresh_from_db()
            self.log_change(request, health, message)

    def _report(
        self, request: HttpRequest, changed: Sequence[ModuleHealth], healths: Sequence[ModuleHealth], state: str
    ) -> None:
        if changed:
            names = ", ".join(h.name for h in changed)
            self.message_user(request, f"Marked {state}: {names}.", messages.SUCCESS)
        changed_keys = {(h.module, h.backend) for h in changed}
        unchanged = [h.name for h in healths if (h.module, h.backend) not in changed_keys]
        if unchanged:
            self.message_user(request, f"Already {state}, nothing changed: {', '.join(unchanged)}.", messages.WARNING)


def held_rows_link(health: ModuleHealth) -> SafeString:
    """The unresolved rows a backend holds, counted, linking to the ledger filtered to them."""
    held = Resource.objects.filter(state__in=UNRESOLVED, module=health.module, backend=health.backend).count()
    if not held:
        return format_html('<span class="health-rows">{}</span>', "it holds no unresolved row")
    link = filtered("resource", needs="unresolved", module=health.module, backend=backend_param(health.backend))
    return format_html('<a href="{}" class="health-rows">its {} unresolved row{}</a>', link, held, pluralize(held))


def module_log_link(health: ModuleHealth) -> str:
    """The modules' log, filtered to this backend."""
    query = {"module": health.module}
    if health.backend or site_backends():
        query["backend"] = backend_param(health.backend)
    return reverse("admin:cleanup_moduleevent_changelist") + "?" + urlencode(query)


def mark_down_link(module: str, backend: str) -> str:
    return reverse("admin:cleanup_modulehealth_mark_down") + "?" + urlencode({"module": module, "backend": backend})


@admin.register(ModuleEvent)
class ModuleEventAdmin(BackendColumnMixin, ReadOnlyAdmin):
    """The modules' log: each time a backend went down, came back, or its waiting work was given up."""

    list_display = ["logged", "module", "kind", "by", "error", "alerted"]
    list_filter = ["kind", "module", BackendFilter]
    ordering = ["-at", "-id"]
    backend_after = "module"
    fields = ("module", "kind", "logged", "by", "error", "alerted", "detail")
    readonly_fields = [*fields, "backend_shown"]

    def get_fields(self, request: HttpRequest, obj: ModuleEvent | None = None) -> tuple[str, ...]:
        fields = [str(name) for name in self.fields or ()]
        if self.shows_backend(request, obj):
            fields.insert(fields.index("module") + 1, "backend_shown")
        return tuple(fields)

    @admin.display(description="at", ordering="at")
    def logged(self, obj: ModuleEvent) -> str:
        return str(when(obj.at))

    @admin.display(description="by")
    def by(self, obj: ModuleEvent) -> str:
        return str((obj.detail or {}).get("by") or "-")

    @admin.display(description="error")
    def error(self, obj: ModuleEvent) -> str:
        detail = obj.detail or {}
        text = detail.get("error") or detail.get("last_error") or ""
        return truncatechars(text, ERROR_CHARS) if text else "-"

    def get_queryset(self, request: HttpRequest) -> QuerySet[ModuleEvent]:
        events: QuerySet[ModuleEvent] = super().get_queryset(request)
        return events.annotate(outbox=Count("alerts"))

    @admin.display(description="staff told")
    def alerted(self, obj: ModuleEvent) -> str:
        """Told only once a mail or webhook about it was accepted (`cleanup.alerts`)."""
        if obj.told_at:
            return str(when(obj.told_at))
        if obj.alerted_at and not getattr(obj, "outbox", obj.alerts.count()):
            return "not told: no alert destination was set"
        return "not yet sent" if obj.alerted_at else "-"
