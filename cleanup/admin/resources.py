"""The ledger's pages: every row a run took, where it stands with its attempts, and waiving rows by hand.

May import the engine (manual), models, conf, `validation` and `.lists`; nothing imports it but the
package, which Django's admin autodiscovery imports.
"""

from django import forms
from django.contrib import admin, messages
from django.template.defaultfilters import truncatechars
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html

from .. import validation
from ..conf import max_revert_attempts
from ..manual import waive
from ..models import Resource, ResourceState, Run
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
    when,
)

ERROR_CHARS = 70


class WaiveForm(forms.Form):
    reason = forms.CharField(
        max_length=500, widget=forms.Textarea(attrs={"rows": 3}), help_text="Why these rows need not be given back."
    )

    def clean_reason(self):
        reason = self.cleaned_data["reason"]
        if message := validation.text_error(reason, validation.MAX_REASON):
            raise forms.ValidationError(f"The reason {message}.")
        return reason


@admin.register(Resource)
class ResourceAdmin(BackendColumnMixin, PersonActionsAdmin):
    list_display = ["ref_short", "state", "attempt", "error", "run_name"]
    list_display_links = ["ref_short"]
    list_filter = [NeedsFilter, "state", ModuleFilter, BackendFilter, KindFilter, "run__cleanup_status"]
    backend_after = "state"
    search_fields = ["ref"]
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
                    "ref",
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
        "ref",
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

    def get_fieldsets(self, request, obj=None):
        fieldsets = self.fieldsets
        if obj is not None and obj.state != ResourceState.WAIVED:
            fieldsets = [f for f in fieldsets if f[0] != "Waiver"]
        if self.shows_backend(request, obj):
            main = fieldsets[0][1]["fields"]
            at = main.index("module") + 1
            fieldsets = [(None, {"fields": [*main[:at], "backend_shown", *main[at:]]}), *fieldsets[1:]]
        return fieldsets

    @admin.display(description="ref", ordering="ref")
    def ref_short(self, obj):
        return truncatechars(obj.ref, 32)

    @admin.display(description="attempts")
    def attempt(self, obj):
        text = attempt_text(obj, max_revert_attempts(), timezone.now())
        waiting = getattr(obj, "waiting", None)
        return format_html('{}; <strong class="waiting">{}</strong>', text, waiting) if waiting else text

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        mark_waiting(changelist.result_list, max_revert_attempts())
        return changelist

    def get_object(self, request, object_id, from_field=None):
        row = super().get_object(request, object_id, from_field)
        if row is not None:
            mark_waiting([row], max_revert_attempts())
        return row

    @admin.display(description="last error")
    def error(self, obj):
        if not obj.last_error:
            return "-"
        return format_html('<span title="{}">{}</span>', obj.last_error, truncatechars(obj.last_error, ERROR_CHARS))

    @admin.display(description="last error")
    def last_error_whole(self, obj):
        if not obj.last_error:
            return "-"
        return format_html('<pre style="white-space:pre-wrap;margin:0">{}</pre>', obj.last_error)

    @admin.display(description="run", ordering="run_id")
    def run_name(self, obj):
        return run_link(obj.run_id, obj.run.name)

    @admin.display(description="next attempt")
    def next_try(self, obj):
        if getattr(obj, "waiting", None):
            return obj.waiting
        at = next_attempt(obj, max_revert_attempts())
        if at is None:
            return "none: " + attempt_text(obj, max_revert_attempts(), timezone.now())
        return when(at) if at > timezone.now() else "at the next pass"

    @admin.display(description="waived at")
    def waived_when(self, obj):
        return when(obj.waived_at)

    @admin.display(description="created")
    def created(self, obj):
        return when(obj.created_at)

    @admin.display(description="updated")
    def updated(self, obj):
        return when(obj.updated_at)

    @admin.display(description="resolved")
    def resolved(self, obj):
        return when(obj.resolved_at)

    @admin.display(description="every attempt")
    def attempt_history(self, obj):
        return history_table(obj)

    @admin.action(permissions=["cleanup_run"], description="Waive: resolve by hand, nothing is given back")
    def waive_rows(self, request, queryset):
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


def history_table(row):
    """Every attempt on the row, newest first, read by row (an index on the attempt table)."""
    attempts = list(row.attempts.order_by("-at", "-id")[:HISTORY_CAP])
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
