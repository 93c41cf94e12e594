"""The admin: runs with their steps, ledger and log; the ledger itself; the log.

Everything is read-only here except through the actions, which call the engine.
"""

from django import forms
from django.contrib import admin, messages
from django.db.models import Count, Q
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join

from .manual import request_cleanup, waive
from .models import UNRESOLVED, Resource, Run, RunLog, Step
from .plan import cleanup_plan
from .runner import RunStateError, cancel_run
from .sweep import CleanupRefused


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class StepInline(ReadOnlyInline):
    model = Step
    fields = ["position", "action_id", "params", "status", "attempts", "last_error", "next_attempt_at"]
    readonly_fields = fields


class ResourceInline(ReadOnlyInline):
    model = Resource
    fields = ["kind", "ref", "module", "state", "revert_attempts", "last_error", "payload"]
    readonly_fields = fields


class RunLogInline(ReadOnlyInline):
    model = RunLog
    fields = ["at", "kind", "detail"]
    readonly_fields = fields
    show_change_link = False


class WaiveForm(forms.Form):
    reason = forms.CharField(max_length=500, widget=forms.Textarea(attrs={"rows": 3}),
                             help_text="Why these rows need not be given back.")

    def clean_reason(self):
        reason = self.cleaned_data["reason"]
        if "\x00" in reason:
            raise forms.ValidationError("A reason may not contain a NUL character.")
        return reason


def _actor(request):
    return request.user.get_username()


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "status", "cleanup_status", "unresolved", "created_at", "ended_at"]
    list_filter = ["status", "cleanup_status"]
    search_fields = ["name"]
    readonly_fields = ["name", "status", "cleanup_status", "auto_cleanup", "wake_at", "created_at",
                       "updated_at", "ended_at", "plan"]
    exclude = ["claim_token", "claim_expires_at"]
    inlines = [StepInline, ResourceInline, RunLogInline]
    actions = ["clean_up", "cancel_with_cleanup", "cancel_without_cleanup"]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            _unresolved=Count("resources", filter=Q(resources__state__in=UNRESOLVED))
        )

    @admin.display(description="unresolved rows", ordering="_unresolved")
    def unresolved(self, obj):
        if not obj._unresolved:
            return 0
        return format_html('<strong style="color:#ba2121">{}</strong>', obj._unresolved)

    @admin.display(description="cleanup plan")
    def plan(self, obj):
        """What the next pass would do, read without side effects (rule 12)."""
        groups = cleanup_plan(obj) if obj.pk else []
        if not groups:
            return "nothing left to give back"
        return format_html(
            "<table><tr><th>verb</th><th>rows</th><th>attempts left</th><th>problem</th></tr>{}</table>",
            format_html_join(
                "",
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                (
                    (
                        g["verb"] or "-",
                        ", ".join(f'{r["ref"]} ({r["state"]})' for r in g["rows"]),
                        min(r["attempts_left"] for r in g["rows"]),
                        g["problem"] or "",
                    )
                    for g in groups
                ),
            ),
        )

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        # Deleting a run deletes its ledger: only an ended run that owes nothing may go.
        if obj is not None and (not obj.is_terminal or obj.resources.filter(state__in=UNRESOLVED).exists()):
            return False
        return super().has_delete_permission(request, obj)

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # it would not ask each run whether it owes anything
        return actions

    def has_cleanup_run_permission(self, request):
        return request.user.has_perm("cleanup.cleanup_run")

    @admin.action(permissions=["cleanup_run"], description="Clean up now (a person's retry: resets attempts)")
    def clean_up(self, request, queryset):
        self._each(request, queryset, lambda run: request_cleanup(run, _actor(request)), "Cleanup queued for")

    @admin.action(permissions=["change"], description="Cancel, and give back what they took")
    def cancel_with_cleanup(self, request, queryset):
        self._each(request, queryset, lambda run: cancel_run(run.pk, actor=_actor(request)), "Cancelled")

    @admin.action(permissions=["change"], description="Cancel, and leave what they took for later")
    def cancel_without_cleanup(self, request, queryset):
        self._each(
            request, queryset, lambda run: cancel_run(run.pk, cleanup=False, actor=_actor(request)), "Cancelled"
        )

    def _each(self, request, queryset, engine_call, done_text):
        """Call the engine for each run; report how many it took and each refusal."""
        done = 0
        for run in queryset:
            try:
                engine_call(run)
                done += 1
            except (CleanupRefused, RunStateError) as exc:
                self.message_user(request, str(exc), messages.ERROR)
        if done:
            self.message_user(request, f"{done_text} {done} run(s).", messages.SUCCESS)


@admin.register(Resource)
class ResourceAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "module", "kind", "ref", "state", "revert_attempts", "last_error", "updated_at"]
    list_filter = ["state", "module", "kind"]
    search_fields = ["ref", "run__name", "last_error"]
    list_select_related = ["run"]
    readonly_fields = [f.name for f in Resource._meta.fields if f.name not in ("claim_token", "claim_expires_at")]
    exclude = ["claim_token", "claim_expires_at"]
    actions = ["waive_rows"]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # the ledger is resolved (given back, orphaned, waived), never deleted

    def has_cleanup_run_permission(self, request):
        return request.user.has_perm("cleanup.cleanup_run")

    @admin.action(permissions=["cleanup_run"], description="Waive: resolve by hand, nothing is given back")
    def waive_rows(self, request, queryset):
        """Asks for the reason first (an intermediate page), then waives."""
        form = WaiveForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            count = waive(list(queryset), form.cleaned_data["reason"], _actor(request))
            self.message_user(request, f"Waived {count} row(s).", messages.SUCCESS)
            return None
        context = {**self.admin_site.each_context(request), "opts": self.model._meta, "rows": queryset,
                   "form": form, "title": "Waive ledger rows"}
        return TemplateResponse(request, "admin/cleanup/resource/waive.html", context)


@admin.register(RunLog)
class RunLogAdmin(admin.ModelAdmin):
    list_display = ["at", "run", "kind", "detail"]
    list_filter = ["kind"]
    search_fields = ["run__name", "kind"]
    list_select_related = ["run"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
