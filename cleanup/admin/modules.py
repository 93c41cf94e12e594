"""The admin's module pages: each module's backend health, marking it down or up by hand, and their log.

A module is marked down by the engine after answers that blame its backend, and up by a
probe that finds it answering; a person can do either here (`cleanup.outages.mark_down`,
`mark_up`), behind the `cleanup.cleanup_run` permission, and is recorded in the modules'
log and in the admin's recent actions. Work waiting on a down module shows why on the
ledger and run pages (`mark_waiting` in `cleanup.admin.lists`). May import the engine
(outages), registry, validation, models and `.lists`; nothing imports it but the package.
"""

from django import forms
from django.contrib import admin, messages
from django.template.defaultfilters import truncatechars
from django.template.response import TemplateResponse
from django.utils.html import format_html

from .. import outages, registry, validation
from ..models import ModuleEvent, ModuleHealth, ModuleState
from .lists import PersonActionsAdmin, ReadOnlyAdmin, actor, when

ERROR_CHARS = 90


class MarkDownForm(forms.Form):
    reason = forms.CharField(
        max_length=validation.MAX_REASON,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Why the backend is out (a deploy, a crash): shown beside every row and step that waits.",
    )

    def clean_reason(self):
        reason = self.cleaned_data["reason"]
        if message := validation.text_error(reason, validation.MAX_REASON):
            raise forms.ValidationError(f"The reason {message}.")
        return reason.strip()


@admin.register(ModuleHealth)
class ModuleHealthAdmin(PersonActionsAdmin):
    list_display = ["module", "state_shown", "since", "error", "next_probe", "failures_in_row", "changed_by"]
    list_filter = ["state"]
    search_fields = ["module"]
    ordering = ["module"]
    actions = ["mark_down", "mark_up"]
    fields = [
        "module",
        "state_shown",
        "since",
        "last_error",
        "next_probe",
        "failures_in_row",
        "changed_by",
        "gave_up",
        "updated",
        "waiting",
    ]
    readonly_fields = fields

    def changelist_view(self, request, extra_context=None):
        # Every registered module is listed, so that one never seen failing can be marked down too.
        ModuleHealth.objects.bulk_create([ModuleHealth(module=m) for m in registry.modules()], ignore_conflicts=True)
        return super().changelist_view(request, extra_context)

    @admin.display(description="state", ordering="state")
    def state_shown(self, obj):
        if obj.state == ModuleState.DOWN:
            return format_html('<strong style="color:{}">down</strong>', "#ba2121")
        return "up"

    @admin.display(description="down since", ordering="down_since")
    def since(self, obj):
        return when(obj.down_since) if obj.state == ModuleState.DOWN else "-"

    @admin.display(description="last error")
    def error(self, obj):
        if not obj.last_error:
            return "-"
        return format_html('<span title="{}">{}</span>', obj.last_error, truncatechars(obj.last_error, ERROR_CHARS))

    @admin.display(description="next probe")
    def next_probe(self, obj):
        return when(obj.next_probe_at) if obj.state == ModuleState.DOWN else "-"

    @admin.display(description="work given up at")
    def gave_up(self, obj):
        return when(obj.gave_up_at)

    @admin.display(description="updated")
    def updated(self, obj):
        return when(obj.updated_at)

    @admin.display(description="its work shows")
    def waiting(self, obj):
        return obj.waiting_text() if obj.state == ModuleState.DOWN else "-"

    @admin.action(permissions=["cleanup_run"], description="Mark down… (its work waits, spending no attempts)")
    def mark_down(self, request, queryset):
        """Asks for the reason first (an intermediate page), then marks each selected module down."""
        modules = list(queryset.order_by("module"))
        form = MarkDownForm(request.POST if "apply" in request.POST else None)
        if not form.is_valid():
            context = {
                **self.admin_site.each_context(request),
                "opts": self.model._meta,
                "modules": modules,
                "form": form,
                "title": "Mark modules down",
            }
            return TemplateResponse(request, "admin/cleanup/modulehealth/mark_down.html", context)
        reason = form.cleaned_data["reason"]
        changed = [h for h in modules if outages.mark_down(h.module, by=actor(request), reason=reason)]
        for health in changed:
            self.log_change(request, health, f"Marked down: {reason}")
        self._report(request, changed, modules, "down")
        return None

    @admin.action(permissions=["cleanup_run"], description="Mark up (its waiting work resumes)")
    def mark_up(self, request, queryset):
        modules = list(queryset.order_by("module"))
        changed = [h for h in modules if outages.mark_up(h.module, by=actor(request))]
        for health in changed:
            self.log_change(request, health, "Marked up")
        self._report(request, changed, modules, "up")
        return None

    def _report(self, request, changed, modules, state):
        if changed:
            names = ", ".join(h.module for h in changed)
            self.message_user(request, f"Marked {state}: {names}.", messages.SUCCESS)
        unchanged = [h.module for h in modules if h not in changed]
        if unchanged:
            self.message_user(request, f"Already {state}, nothing changed: {', '.join(unchanged)}.", messages.WARNING)


@admin.register(ModuleEvent)
class ModuleEventAdmin(ReadOnlyAdmin):
    """The modules' log: each time one went down, came back, or its waiting work was given up."""

    list_display = ["logged", "module", "kind", "by", "error", "alerted"]
    list_filter = ["kind", "module"]
    ordering = ["-at", "-id"]
    fields = ["module", "kind", "logged", "by", "error", "alerted", "detail"]
    readonly_fields = fields

    @admin.display(description="at", ordering="at")
    def logged(self, obj):
        return when(obj.at)

    @admin.display(description="by")
    def by(self, obj):
        return (obj.detail or {}).get("by") or "-"

    @admin.display(description="error")
    def error(self, obj):
        detail = obj.detail or {}
        text = detail.get("error") or detail.get("last_error") or ""
        return truncatechars(text, ERROR_CHARS) if text else "-"

    @admin.display(description="staff told")
    def alerted(self, obj):
        return when(obj.alerted_at) if obj.alerted_at else "-"
