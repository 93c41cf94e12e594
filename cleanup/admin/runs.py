"""The runs' pages: the list of runs, a run's page (timeline, rows, plan, steps, log), the steps, the run log.

A run changes only through its actions (start, run again, end now, clean up now, cancel),
each confirmed on a page of its own; a run is never deleted. May import the engine (manual,
runner, plan, sweep, timeline), models, conf, `.lists` and `.starting` (the start, run-again
and end pages); nothing imports it but the package, which Django's admin autodiscovery imports.
"""

from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.defaultfilters import truncatechars
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.views.decorators.http import require_safe

from .. import timeline
from ..conf import max_revert_attempts, setting
from ..manual import check_cleanup, request_cleanups
from ..models import UNRESOLVED, Resource, ResourceState, Run, RunLog, RunStatus, Step
from ..plan import WAITING, cleanup_plan, unread_ids
from ..rows import counted_unresolved
from ..runner import RunStateError, cancel_run
from ..security import refreshes_itself
from ..sweep import CleanupRefused
from . import charts, live
from .idents import whole_id
from .lists import (
    BackendColumnMixin,
    BackendFilter,
    LogKindFilter,
    PersonActionsAdmin,
    ReadOnlyAdmin,
    actor,
    attempt_text,
    filtered,
    mark_steps_waiting,
    mark_waiting,
    run_link,
    site_backends,
    state_shown,
    when,
)
from .logtext import details, sentence
from .runfilters import RunBackendFilter, StartedByFilter
from .snapshot import snapshot
from .starting import RunStartAdmin, give_back_preview
from .summaries import row_what

# How much of a run its page shows; the rest is one link away, in the filtered lists.
PAGE_ROWS = 50
PAGE_STEPS = 50
PAGE_LOG = 50
PLAN_ROWS = 200
ERROR_CHARS = 240  # a reason read in the list, wrapping; the whole on the step's page


@admin.register(Run)
class RunAdmin(RunStartAdmin, PersonActionsAdmin):
    list_display = ["id", "name", "status", "cleanup_status", "unresolved", "created", "ended"]
    list_display_links = ["id", "name"]
    list_filter = [
        "status",
        "cleanup_status",
        RunBackendFilter,
        StartedByFilter,
        ("created_at", admin.DateFieldListFilter),
    ]
    search_fields = ["name"]
    fields = [("name", "status", "cleanup_status"), ("auto_cleanup", "wakes", "created", "ended")]
    readonly_fields = ["name", "status", "cleanup_status", "auto_cleanup", "wakes", "created", "ended"]
    actions = ["clean_up", "cancel_with_cleanup", "cancel_without_cleanup"]
    change_form_template = "admin/cleanup/run/change_form.html"
    ordering = ["-id"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Run]:
        # Counted per listed run through the partial index of unresolved rows, as the row
        # owner counts them (`rows.counted_unresolved`): the number its page and the index say.
        unresolved = (
            counted_unresolved(Resource.objects.filter(run=OuterRef("pk")))
            .order_by()
            .values("run")
            .annotate(n=Count("id"))
            .values("n")
        )
        return (
            super()
            .get_queryset(request)
            .annotate(_unresolved=Coalesce(Subquery(unresolved, output_field=IntegerField()), 0))
        )

    @admin.display(description="unresolved rows")
    def unresolved(self, obj: Run) -> int | SafeString:
        count: int = getattr(obj, "_unresolved", 0)  # annotated by `get_queryset`
        if not count:
            return 0
        link = filtered("resource", run__id__exact=obj.pk, needs="unresolved")
        if not obj.is_terminal:
            # What a running run holds is its own, not a failure: it is given back when it ends.
            return format_html('<a href="{}" class="state-held">holds {}</a>', link, count)
        return format_html('<a href="{}" class="count-alert">{}</a>', link, count)

    def get_urls(self) -> list[URLPattern]:
        # A fragment is read, never written to: GET and HEAD alone.
        # Read by the page itself: not a person's activity for the idle session's clock.
        run = refreshes_itself(self.admin_site.admin_view(require_safe(live.unless_unchanged(self.live_view))))
        run.model_admin = self  # type: ignore[attr-defined]  # the input guard checks its query as any page's of this admin
        index = refreshes_itself(self.admin_site.admin_view(require_safe(live.unless_unchanged(live.index_fragment))))
        return [
            path("<int:object_id>/live/", run, name="cleanup_run_live"),
            path("live-index/", index, name="cleanup_live_index"),
            *super().get_urls(),
        ]

    def live_view(self, request: HttpRequest, object_id: int) -> TemplateResponse:
        """The live parts of a run's page (`cleanup.admin.live`): permission first, then the run."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        with snapshot():
            run = self.get_object(request, str(object_id))
            if run is None:
                raise Http404("No such run.")
            context = {**self.run_page(request, run, live_read=False), "original": run}
            response = TemplateResponse(request, "admin/cleanup/run/live.html", context)
            response.render()  # inside the snapshot
            return response

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: Run) -> str:
        return str(when(obj.created_at))

    @admin.display(description="ended", ordering="ended_at")
    def ended(self, obj: Run) -> str:
        return str(when(obj.ended_at))

    @admin.display(description="next look")
    def wakes(self, obj: Run) -> str:
        # An ended run is never woken again: its wake time would only mislead.
        return "-" if obj.is_terminal else str(when(obj.wake_at))

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # Checked before anything is read (the gate of `PermissionFirstMixin` checks it too).
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        # Status, counts, rows, plan, timeline and actions from one snapshot, so that they
        # never disagree; not with ?live=1, whose module calls stay outside any transaction.
        reading = request.method in ("GET", "HEAD") and request.GET.get("live") != "1"
        with snapshot() if reading else nullcontext():
            run = self.get_object(request, object_id)
            extra: dict[str, Any] = {}
            if run is not None:
                extra = self.run_page(request, run)
            response = super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})
            if reading and isinstance(response, TemplateResponse):
                response.render()  # inside the snapshot: a template's lazy query reads it too
            return response

    def run_page(self, request: HttpRequest, run: Run, live_read: bool | None = None) -> dict[str, Any]:
        """Steps, rows (unresolved first), log (newest first) and plan, each capped.

        As the API shows them: the rows, their counts, the plan and its live values only
        with ``view_resource``, the log only with ``view_runlog``; what the user may not see
        is not read, and no live value is read for them. ``live_read``: read the leased
        targets' live values (``?live=1`` on the page; never in the fragment the live bar
        reads again).
        """
        if live_read is None:
            live_read = request.GET.get("live") == "1"
        see_rows = request.user.has_perm("cleanup.view_resource")
        see_log = request.user.has_perm("cleanup.view_runlog")
        context: dict[str, Any] = {
            "run": run,
            "see_rows": see_rows,
            "see_log": see_log,
            "can_clean_up": self.has_cleanup_run_permission(request),
            "can_cancel": self.has_cancel_permission(request) and not run.is_terminal,
            "can_start": self.has_add_permission(request),
            "waiting": WAITING,
        }
        steps = list(Step.objects.filter(run=run).order_by("position")[:PAGE_STEPS])
        mark_steps_waiting(steps)
        context.update(
            fleet=any(s.backend for s in steps),
            steps=steps,
            step_total=Step.objects.filter(run=run).count(),
            links={
                "rows": filtered("resource", run__id__exact=run.pk),
                "unresolved": filtered("resource", run__id__exact=run.pk, needs="unresolved"),
                "steps": filtered("step", run__id__exact=run.pk),
                "log": filtered("runlog", run__id__exact=run.pk),
            },
        )
        if see_log:
            context.update(
                log=in_words(RunLog.objects.filter(run=run).order_by("-id")[:PAGE_LOG]),
                log_total=RunLog.objects.filter(run=run).count(),
            )
        context.update(
            live_read=live_read and see_rows,
            live_src=reverse("admin:cleanup_run_live", args=[run.pk]),
            fields_now={
                "status": run.get_status_display(),
                "cleanup_status": run.get_cleanup_status_display(),
                "ended": self.ended(run),
                "wakes": self.wakes(run),
            },
        )
        if see_rows:
            context.update(self.ledger_part(request, run, steps, live_read))
        # The timeline draws the rows and the log: it is shown to who may see both.
        context["timeline"] = timeline.svg(run) if see_rows and see_log else None
        context["run_chart"] = charts.run_given_back_per_minute(run) if see_rows else None
        return context

    def ledger_part(self, request: HttpRequest, run: Run, steps: Sequence[Step], live_read: bool) -> dict[str, Any]:
        """The run's rows, their counts and its cleanup plan (with live values on ``?live=1``)."""
        max_attempts = max_revert_attempts()
        now = timezone.now()
        # The unresolved rows as they are counted: a step's placeholder beside the resources
        # it stands for is neither listed nor counted (`rows.counted_unresolved`).
        waiting = counted_unresolved(Resource.objects.filter(run=run))
        rows = list(waiting.select_related("run").order_by("id")[:PAGE_ROWS])
        if len(rows) < PAGE_ROWS:
            rows += list(
                Resource.objects.filter(run=run)
                .exclude(state__in=UNRESOLVED)
                .select_related("run")
                .order_by("-id")[: PAGE_ROWS - len(rows)]
            )
        mark_waiting(rows, max_attempts)
        for row in rows:
            # What the page's template shows of each row, worked out here.
            row.attempt_text = attempt_text(row, max_attempts, now)
            row.state_class, row.state_word, row.state_line = state_shown(row)
            row.what = row_what(row.kind, row.ref, row.payload)
            row.ref_shown = whole_id(row.ref, href=reverse("admin:cleanup_resource_change", args=[row.pk]))
        by_state_and_backend = (
            Resource.objects.filter(run=run).order_by().values_list("state", "backend").annotate(n=Count("id"))
        )
        counts: dict[str, int] = {}
        backends: dict[str, int] = {}
        for state, backend, n in by_state_and_backend:
            counts[state] = counts.get(state, 0) + n
            backends[backend] = backends.get(backend, 0) + n
        row_total = sum(counts.values())
        # Each unresolved state as the row owner counts it, so the states add up to the
        # unresolved rows the heading, the index, its filters and an alert say.
        unresolved_by_state = dict(waiting.order_by().values_list("state").annotate(n=Count("id")))
        aside = sum(counts.get(s, 0) for s in UNRESOLVED) - sum(unresolved_by_state.values())
        counts = {s: n for s, n in counts.items() if s not in UNRESOLVED} | unresolved_by_state
        fleet = bool(
            site_backends(request) or any(backends) or any(s.backend for s in steps) or any(r.backend for r in rows)
        )
        # ?live=1 also reads the leased targets through their leases, bounded as for the API
        # (EVENT_LIVE_READS_PER_REQUEST within EVENT_LIVE_READ_BUDGET_S).
        plan = cleanup_plan(run, max_rows=PLAN_ROWS, live=live_read)
        return {
            "rows": rows,
            "row_counts": [(s.label, counts.get(s.value, 0)) for s in ResourceState if counts.get(s.value)],
            "row_total": row_total,
            "placeholders_aside": aside,
            "row_listed": row_total - aside,
            "fleet": fleet,
            "row_backends": [
                (backend, n, filtered("resource", run__id__exact=run.pk, backend=backend))
                for backend, n in sorted(backends.items())
                if backend
            ]
            if fleet
            else [],
            "unresolved_total": sum(unresolved_by_state.values()),
            "plan": plan,
            "plan_capped": sum(len(g["rows"]) for g in plan) >= PLAN_ROWS,
            "plan_unread": len(unread_ids(plan)) if live_read else 0,
            "live_cap": setting("EVENT_LIVE_READS_PER_REQUEST"),
            "live_budget": setting("EVENT_LIVE_READ_BUDGET_S"),
            "has_leases": any("lease" in g["rows"][0] for g in plan),
            "max_attempts": max_attempts,
        }

    def has_delete_permission(self, request: HttpRequest, obj: Run | None = None) -> bool:
        # Deleting a run would delete its ledger, the record of what it took and gave back.
        return False

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("cleanup.change_run")

    @admin.action(permissions=["cleanup_run"], description="Clean up now (a person's retry: resets attempts)")
    def clean_up(self, request: HttpRequest, queryset: QuerySet[Run]) -> HttpResponse | None:
        """Confirmed on a page that shows what will be reset and what the pass will do."""
        runs = list(queryset.order_by("id"))
        if "apply" not in request.POST:
            return self.confirm(request, runs, "clean_up", "Clean up now", self.cleanup_preview(runs))
        accepted, refused = request_cleanups(runs, actor(request))
        for text in refused:
            self.message_user(request, text, messages.WARNING)
        for run, reset in accepted:
            self.log_change(request, run, f"Clean up now: {reset} row(s) reset, a pass queued")
        if accepted:
            links = format_html(", ".join(["{}"] * len(accepted)), *[run_link(r.pk, r.name) for r, _ in accepted])
            self.message_user(
                request,
                format_html(
                    "Cleanup queued for {} run(s): {}. Their rows are back under the attempt ceiling; "
                    "each run's page shows the pass's outcome.",
                    len(accepted),
                    links,
                ),
                messages.SUCCESS,
            )
        if len(runs) == 1:
            return HttpResponseRedirect(reverse("admin:cleanup_run_change", args=[runs[0].pk]))
        return None

    def cleanup_preview(self, runs: Sequence[Run]) -> list[dict[str, Any]]:
        preview = []
        for run in runs[:PAGE_ROWS]:
            try:
                check_cleanup(run)
                refusal = None
            except CleanupRefused as exc:
                refusal = str(exc)
            entry: dict[str, Any] = {"run": run, "refusal": refusal}
            if refusal is None:
                counts = dict(
                    counted_unresolved(Resource.objects.filter(run=run))
                    .order_by()
                    .values_list("state")
                    .annotate(n=Count("id"))
                )
                entry["reset"] = sorted(counts.items())
                entry["plan"] = cleanup_plan(run, max_rows=PAGE_ROWS)
            preview.append(entry)
        return preview

    @admin.action(permissions=["cancel"], description="Cancel, and give back what they took")
    def cancel_with_cleanup(self, request: HttpRequest, queryset: QuerySet[Run]) -> HttpResponse | None:
        return self.cancel(request, queryset, True)

    @admin.action(permissions=["cancel"], description="Cancel, and leave what they took for later")
    def cancel_without_cleanup(self, request: HttpRequest, queryset: QuerySet[Run]) -> HttpResponse | None:
        return self.cancel(request, queryset, False)

    def cancel(self, request: HttpRequest, queryset: QuerySet[Run], cleanup: bool) -> HttpResponse | None:
        runs = list(queryset.order_by("id"))
        action = "cancel_with_cleanup" if cleanup else "cancel_without_cleanup"
        title = "Cancel and give back" if cleanup else "Cancel and leave for later"
        if "apply" not in request.POST:
            preview = [
                {
                    "run": r,
                    "refusal": None
                    if r.status == RunStatus.RUNNING
                    else f"run {r.pk} has already ended ({r.status}); nothing to cancel",
                    **(give_back_preview(r) if cleanup and r.status == RunStatus.RUNNING else {}),
                }
                for r in runs[:PAGE_ROWS]
            ]
            return self.confirm(request, runs, action, title, preview, cleanup=cleanup)
        done = 0
        for run in runs:
            try:
                cancel_run(run.pk, cleanup=cleanup, actor=actor(request))
            except (RunStateError, Run.DoesNotExist) as exc:
                self.message_user(request, str(exc), messages.WARNING)
                continue
            done += 1
            self.log_change(request, run, f"{title}")
        if done:
            self.message_user(request, f"Cancelled {done} run(s).", messages.SUCCESS)
        if len(runs) == 1:
            return HttpResponseRedirect(reverse("admin:cleanup_run_change", args=[runs[0].pk]))
        return None

    def confirm(
        self,
        request: HttpRequest,
        runs: Sequence[Run],
        action: str,
        title: str,
        preview: Sequence[dict[str, Any]],
        **extra: object,
    ) -> TemplateResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "runs": runs,
            "preview": preview,
            "more": max(0, len(runs) - len(preview)),
            "action": action,
            "title": title,
            "waiting": WAITING,
            **extra,
        }
        return TemplateResponse(request, "admin/cleanup/run/confirm_action.html", context)


def in_words(entries: Iterable[RunLog]) -> list[RunLog]:
    """Log entries with their sentence and their labelled details (`.logtext`)."""
    listed = list(entries)
    for entry in listed:
        entry.sentence = sentence(entry.kind, entry.detail)  # type: ignore[attr-defined]  # for the template
        entry.pairs = details(entry.detail)  # type: ignore[attr-defined]  # for the template
    return listed


# -- steps and the log ----------------------------------------------------------------------


@admin.register(Step)
class StepAdmin(BackendColumnMixin, ReadOnlyAdmin):
    list_display = ["position", "action_id", "status", "attempts", "error", "run_name", "finished"]
    list_filter = ["status", BackendFilter]
    backend_after = "action_id"
    list_select_related = ["run"]
    ordering = ["run_id", "position"]
    fields = (
        "run_name",
        "position",
        "action_id",
        "params",
        "status",
        "attempts",
        "last_error",
        "started",
        "finished",
        "idempotency_key",
    )
    readonly_fields = [*fields, "backend_shown"]

    def get_fields(self, request: HttpRequest, obj: Step | None = None) -> tuple[str, ...]:
        fields = [str(name) for name in self.fields or ()]
        if self.shows_backend(request, obj):
            fields.insert(fields.index("action_id") + 1, "backend_shown")
        return tuple(fields)

    @admin.display(description="last error")
    def error(self, obj: Step) -> str:
        return truncatechars(obj.last_error, ERROR_CHARS) if obj.last_error else "-"

    @admin.display(description="run")
    def run_name(self, obj: Step) -> SafeString:
        link: SafeString = run_link(obj.run_id, obj.run.name)
        return link

    @admin.display(description="started")
    def started(self, obj: Step) -> str:
        return str(when(obj.started_at))

    @admin.display(description="finished")
    def finished(self, obj: Step) -> str:
        return str(when(obj.finished_at))


@admin.register(RunLog)
class RunLogAdmin(ReadOnlyAdmin):
    list_display = ["logged", "run_name", "kind", "detail_short"]
    list_filter = [LogKindFilter]
    list_select_related = ["run"]
    ordering = ["-id"]
    fields = ("run_name", "kind", "detail_short", "detail_pairs", "logged")
    readonly_fields = fields

    @admin.display(description="at", ordering="at")
    def logged(self, obj: RunLog) -> str:
        return str(when(obj.at))

    @admin.display(description="run")
    def run_name(self, obj: RunLog) -> SafeString:
        link: SafeString = run_link(obj.run_id, obj.run.name)
        return link

    @admin.display(description="what happened")
    def detail_short(self, obj: RunLog) -> str:
        return truncatechars(sentence(obj.kind, obj.detail), 160)

    @admin.display(description="details")
    def detail_pairs(self, obj: RunLog) -> str:
        pairs = details(obj.detail)
        if not pairs:
            return "-"
        return format_html(
            '<dl class="log-details">{}</dl>',
            format_html("".join(["<dt>{}</dt><dd>{}</dd>"] * len(pairs)), *[v for pair in pairs for v in pair]),
        )
