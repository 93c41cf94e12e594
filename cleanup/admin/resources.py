"""The ledger's pages: every row a run took, where it stands with its attempts, and waiving rows by hand.

May import the engine (manual, `rows`), models, conf, `validation`, `.lists` and `.livelist`; nothing imports it but the
package, which Django's admin autodiscovery imports.
"""

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.defaultfilters import truncatechars
from django.template.response import TemplateResponse
from django.urls import URLPattern, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .. import rows as ledger_rows
from .. import validation
from ..conf import max_revert_attempts
from ..manual import waive
from ..models import UNRESOLVED, Resource, ResourceState, Run, backend_name
from .idents import whole_id
from .lists import (
    BackendColumnMixin,
    BackendFilter,
    KindFilter,
    ModuleFilter,
    NeedsFilter,
    PersonActionsAdmin,
    actor,
    attempt_text,
    mark_waiting,
    next_attempt,
    run_link,
    short_when,
    state_shown,
    utc_when,
    when,
)
from .livelist import LiveListMixin
from .summaries import row_what

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldsetSpec, _ListDisplayT

# Enough for a module's reason to be read in the list; the whole is on hover and the row's page.
ERROR_CHARS = 240
# A search reads the unresolved rows (their partial index) and this many of the newest rows
# (a range of the primary key), never the whole ledger.
SEARCH_WINDOW = 100_000


class WaiveForm(forms.Form):
    reason = forms.CharField(
        max_length=500, widget=forms.Textarea(attrs={"rows": 3}), help_text="Why these rows need not be given back."
    )

    def clean_reason(self) -> str:
        reason: str = self.cleaned_data["reason"]
        if message := validation.text_error(reason, validation.MAX_REASON):
            raise forms.ValidationError(f"The reason {message}.")
        return reason


@admin.register(Resource)
class ResourceAdmin(LiveListMixin, BackendColumnMixin, PersonActionsAdmin):
    live_url_name = "cleanup_resource_live"
    live_template = "admin/cleanup/resource/live.html"
    live_refused = "These filters are not the ledger's."
    list_display = ["ref_short", "what", "state_shown", "attempt", "error", "module_shown", "run_name", "updated_short"]
    # The ref links to the row itself (`ref_short`), beside its copy button.
    list_display_links = None
    list_filter = [NeedsFilter, "state", ModuleFilter, BackendFilter, KindFilter, "run__cleanup_status"]
    backend_after = "state"
    # Ref, kind and the words of the payload ("troll", "north-gate"); `get_search_results` bounds it.
    search_fields = ["ref", "kind", "payload"]
    search_help_text = (
        "Finds rows by ref, kind and the words of their payload (creature, place), among the unresolved rows "
        f"and the newest {SEARCH_WINDOW:,} of the ledger."
    )
    change_list_template = "admin/cleanup/resource/change_list.html"
    change_form_template = "admin/cleanup/resource/change_form.html"
    list_select_related = ["run"]
    ordering = ["-id"]
    actions = ["waive_rows"]
    fieldsets = [
        (
            None,
            {
                "fields": [
                    "run_name",
                    "step",
                    "module",
                    "kind",
                    "ref_whole",
                    "member_key",
                    "state",
                    "attempt",
                    "next_try",
                    "last_error_whole",
                ]
            },
        ),
        ("Waiver", {"fields": ["waived_reason", "waived_by", "waived_when"]}),
        ("Attempts, newest first", {"fields": ["attempt_history"]}),
        ("Record", {"fields": ["payload", "created", "updated", "resolved", "resurrected_from"]}),
    ]
    readonly_fields = [
        "run_name",
        "step",
        "module",
        "backend_shown",
        "kind",
        "ref_whole",
        "member_key",
        "state",
        "attempt",
        "next_try",
        "last_error_whole",
        "waived_reason",
        "waived_by",
        "waived_when",
        "attempt_history",
        "payload",
        "created",
        "updated",
        "resolved",
        "resurrected_from",
    ]

    def get_fieldsets(self, request: HttpRequest, obj: Resource | None = None) -> "_FieldsetSpec":
        fieldsets: list[tuple[Any, Any]] = list(self.fieldsets or [])
        if obj is not None and obj.state != ResourceState.WAIVED:
            fieldsets = [f for f in fieldsets if f[0] != "Waiver"]
        if self.shows_backend(request, obj):
            main = list(fieldsets[0][1]["fields"])
            at = main.index("module") + 1
            fieldsets = [(None, {"fields": [*main[:at], "backend_shown", *main[at:]]}), *fieldsets[1:]]
        return fieldsets

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """A row's page offers what a person does about it: the waiver, and the retry of its run."""
        row = self.get_object(request, object_id)
        extra: dict[str, Any] = {}
        if row is not None and row.state in UNRESOLVED and self.has_cleanup_run_permission(request):
            extra = {"can_waive": True, "can_retry_run": row.run.is_terminal}
        return super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})

    def get_list_display(self, request: HttpRequest) -> "_ListDisplayT[Resource]":
        # The module column names the backend too ("sandbox/north"): no column of its own here.
        return list(self.list_display)

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Resource], search_term: str
    ) -> tuple[QuerySet[Resource], bool]:
        """A search over a window: the unresolved rows and the newest `SEARCH_WINDOW` rows."""
        if not search_term.strip():
            return super().get_search_results(request, queryset, search_term)
        newest = Resource.objects.order_by("-id").values_list("id", flat=True).first() or 0
        window = queryset.filter(Q(state__in=UNRESOLVED) | Q(id__gt=newest - SEARCH_WINDOW))
        return super().get_search_results(request, window, search_term)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return super().changelist_view(request, {"live_src": self.live_src(request), **(extra_context or {})})

    def get_urls(self) -> list[URLPattern]:
        urls: list[URLPattern] = super().get_urls()
        return [*self.live_urls(), *urls]

    @admin.display(description="ref", ordering="ref")
    def ref_short(self, obj: Resource) -> SafeString:
        return whole_id(obj.ref, href=reverse("admin:cleanup_resource_change", args=[obj.pk]))

    @admin.display(description="ref")
    def ref_whole(self, obj: Resource) -> SafeString:
        return whole_id(obj.ref, width=len(obj.ref))

    @admin.display(description="what", ordering="kind")
    def what(self, obj: Resource) -> str:
        words = row_what(obj.kind, obj.ref, obj.payload)
        if words == obj.kind:
            return obj.kind
        return format_html('{}: <span class="what-words">{}</span>', obj.kind, words)

    @admin.display(description="state", ordering="state")
    def state_shown(self, obj: Resource) -> SafeString:
        css, word, line = state_shown(obj)
        if not line:
            return format_html('<span class="{}">{}</span>', css, word)
        return format_html('<span class="{}">{}</span><span class="state-line">{}</span>', css, word, line)

    @admin.display(description="attempts")
    def attempt(self, obj: Resource) -> str:
        return str(attempt_text(obj, max_revert_attempts(), timezone.now()))

    @admin.display(description="module", ordering="module")
    def module_shown(self, obj: Resource) -> str:
        return str(backend_name(obj.module, obj.backend))

    @admin.display(description="updated", ordering="updated_at")
    def updated_short(self, obj: Resource) -> SafeString:
        return format_html('<span title="{}">{}</span>', utc_when(obj.updated_at), short_when(obj.updated_at))

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        changelist = super().get_changelist_instance(request)
        mark_waiting(changelist.result_list, max_revert_attempts())
        return changelist

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Resource | None:
        row = super().get_object(request, object_id, from_field)
        if row is not None:
            mark_waiting([row], max_revert_attempts())
        return row

    @admin.display(description="last error")
    def error(self, obj: Resource) -> str:
        if not obj.last_error:
            return "-"
        return format_html('<span title="{}">{}</span>', obj.last_error, truncatechars(obj.last_error, ERROR_CHARS))

    @admin.display(description="last error")
    def last_error_whole(self, obj: Resource) -> str:
        if not obj.last_error:
            return "-"
        return format_html('<pre style="white-space:pre-wrap;margin:0">{}</pre>', obj.last_error)

    @admin.display(description="run", ordering="run_id")
    def run_name(self, obj: Resource) -> SafeString:
        link: SafeString = run_link(obj.run_id, obj.run.name)
        return link

    @admin.display(description="next attempt")
    def next_try(self, obj: Resource) -> str:
        waiting: str | None = getattr(obj, "waiting", None)
        if waiting:
            return waiting
        at: datetime | None = next_attempt(obj, max_revert_attempts())
        if at is None:
            return "none: " + str(attempt_text(obj, max_revert_attempts(), timezone.now()))
        return str(when(at)) if at > timezone.now() else "at the next pass"

    @admin.display(description="waived at")
    def waived_when(self, obj: Resource) -> str:
        return str(when(obj.waived_at))

    @admin.display(description="created")
    def created(self, obj: Resource) -> str:
        return str(when(obj.created_at))

    @admin.display(description="updated")
    def updated(self, obj: Resource) -> str:
        return str(when(obj.updated_at))

    @admin.display(description="resolved")
    def resolved(self, obj: Resource) -> str:
        return str(when(obj.resolved_at))

    @admin.display(description="every attempt")
    def attempt_history(self, obj: Resource) -> str:
        return history_table(obj)

    @admin.action(permissions=["cleanup_run"], description="Waive: resolve by hand, nothing is given back")
    def waive_rows(self, request: HttpRequest, queryset: QuerySet[Resource]) -> TemplateResponse | None:
        """Asks for the reason first (an intermediate page), then waives."""
        form = WaiveForm(request.POST if "apply" in request.POST else None)
        rows = list(queryset.select_related("run")[:1000])
        if form.is_valid():
            count = waive(rows, form.cleaned_data["reason"], actor(request))
            for run_id, name in sorted({(r.run_id, r.run.name) for r in rows}):
                self.log_change(request, Run(pk=run_id, name=name), f"Waived rows: {form.cleaned_data['reason']}")
            self.message_user(request, f"Waived {count} row(s).", messages.SUCCESS)
            return None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "rows": rows,
            "form": form,
            "title": "Waive ledger rows",
        }
        return TemplateResponse(request, "admin/cleanup/resource/waive.html", context)


HISTORY_CAP = 200


def history_table(row: Resource) -> str:
    """Every attempt on the row, newest first, read by row (an index on the attempt table);
    the one that gave it back is the row's own (`rows.history`)."""
    attempts = ledger_rows.history(row, list(row.attempts.order_by("-at", "-id")[:HISTORY_CAP]))[:HISTORY_CAP]
    if not attempts:
        return "no attempt yet"
    body = format_html(
        "".join(
            [
                "<tr><td>{}</td><td>{}</td><td>{}</td><td><pre style='white-space:pre-wrap;margin:0'>{}</pre></td>"
                "<td>{}</td></tr>"
            ]
            * len(attempts)
        ),
        *[v for a in attempts for v in (a.number, when(a.at), a.outcome, a.error or "-", a.by or "-")],
    )
    return format_html(
        '<table class="attempt-history"><thead><tr><th>#</th><th>at</th><th>outcome</th><th>error</th>'
        "<th>by</th></tr></thead><tbody>{}</tbody></table>",
        body,
    )
