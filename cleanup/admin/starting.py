"""Starting and ending runs from the admin: "Start a run…", "Run again…" and "End now…".

Each is a form, then a confirmation page that shows what will happen, then one call of
the engine's own entry point, as the API's: `runner.validate_spec` and `runner.start_run`
for a start (so the messages beside each field are the API's, keyed ``steps[1].params``),
`runner.cancel_run` for an end. Each checks its permission before anything else is read
(``add_run`` to start or run again, ``change_run`` to end, as in the API) and is recorded
with who asked: in the run log by the engine, and in the admin's recent actions here.

May import: the engine's entry points (`runner`, `plan`, `registry`, `validation`), the
models, conf and `.lists`; only `.runs` imports it.
"""

import inspect
import json
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, QueryDict
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import escape, format_html
from django.utils.safestring import mark_safe

from .. import registry, validation
from ..models import STEP_KIND, UNRESOLVED, CleanupStatus, Resource, Run, RunStatus, Step, StepStatus
from ..plan import cleanup_plan
from ..runner import CleanedStep, RunSpecError, RunStateError, cancel_run, start_run, validate_spec
from .lists import actor

# The form shows the run's steps and a few blank lines; "Add step lines" adds more.
BLANK_LINES = 3
MORE_LINES = 5
SHOWN_ROWS = 50  # rows listed on the end's confirmation; the rest are counted
_CODE = re.compile(r"``(.+?)``", re.S)

# A step line of the form: its action and its params as the JSON text typed.
Line = dict[str, str]

if TYPE_CHECKING:
    _RunAdmin = admin.ModelAdmin[Run]
else:
    _RunAdmin = object


def installed() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The actions a step may name and the leases ``core.lease`` may apply, each with the
    first paragraph of its own description (which lists its params), sorted by id."""

    def entry(item: registry.Action | registry.Lease, kind: str) -> dict[str, Any]:
        doc = inspect.getdoc(type(item)) or ""
        first = doc.split("\n\n")[0].replace("\n", " ").strip()
        # "``sandbox.spawn``: ``{…}``": the id is in its own column already.
        first = first.removeprefix(f"``{item.id}``:").strip()
        text = _CODE.sub(lambda m: f"<code>{m[1]}</code>", str(escape(first)))
        return {"id": item.id, "module": item.module, "kind": kind, "doc": mark_safe(text)}  # escaped above

    actions = [entry(a, "action") for _, a in sorted(registry.actions().items())]
    leases = [entry(lease, "lease") for _, lease in sorted(registry.leases().items())]
    return actions, leases


def _run_name(run_id: int | None) -> str:
    """The name of the run a run-again copies, for its breadcrumb ("#8 Wolf hunt")."""
    if run_id is None:
        return ""
    return str(Run.objects.filter(pk=run_id).values_list("name", flat=True).first() or "")


class StepLines:
    """The form's step lines: an action and its params (JSON) on each, blank lines skipped.

    ``spec`` is what the engine validates; ``errors`` maps a line to the engine's messages
    about it, so each is shown beside its own line.
    """

    def __init__(self, lines: list[Line]) -> None:
        self.lines = lines
        self.errors: dict[int, dict[str, str]] = {}
        self.general: dict[str, str] = {}
        self.spec: list[dict[str, Any]] = []
        self._line_of: dict[int, int] = {}
        for index, line in enumerate(lines):
            if not line["action"] and not line["params"].strip():
                continue
            position = len(self.spec)
            self._line_of[position] = index
            params: Any = {}
            if line["params"].strip():
                try:
                    params = validation.parse_json(line["params"], f"steps[{position}].params")
                except validation.Invalid as exc:
                    self.errors.setdefault(index, {}).update(exc.errors)
                    params = {}
            self.spec.append({"action": line["action"], "params": params})

    @classmethod
    def from_post(cls, data: QueryDict) -> "StepLines":
        count = _int(data.get("lines"), BLANK_LINES) or 0
        count = max(1, min(count, validation.limit("EVENT_MAX_STEPS") + MORE_LINES))
        return cls(
            [
                {"action": data.get(f"step-{i}-action", "").strip(), "params": data.get(f"step-{i}-params", "")}
                for i in range(count)
            ]
        )

    @classmethod
    def from_steps(cls, steps: Iterable[Step]) -> "StepLines":
        return cls([{"action": s.action_id, "params": json.dumps(s.params or {}, ensure_ascii=False)} for s in steps])

    def with_blank(self, n: int) -> "StepLines":
        self.lines += [{"action": "", "params": ""} for _ in range(n)]
        return self

    def take(self, errors: Mapping[str, str]) -> None:
        """File the engine's messages: each ``steps[i]…`` beside its line, the rest above."""
        for field, message in errors.items():
            match = re.match(r"steps\[(\d+)\]", field)
            index = self._line_of.get(int(match[1])) if match else None
            if index is None:
                self.general[field] = message
            elif match and not any(f.startswith(f"steps[{match[1]}].params") for f in self.errors.get(index, {})):
                self.errors.setdefault(index, {})[field] = message

    def rows(self) -> list[dict[str, Any]]:
        return [{**line, "index": i, "errors": self.errors.get(i, {})} for i, line in enumerate(self.lines)]


def _int(value: str | None, default: int | None) -> int | None:
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        return default


class RunStartAdmin(_RunAdmin):
    """The start, run-again and end pages of `RunAdmin` (mixed in before it)."""

    def get_urls(self) -> list[URLPattern]:
        prefix = f"{self.opts.app_label}_{self.opts.model_name}"
        own = [
            path("<int:object_id>/again/", self.admin_site.admin_view(self.again_view), name=f"{prefix}_again"),
            path("<int:object_id>/end/", self.admin_site.admin_view(self.end_view), name=f"{prefix}_end"),
        ]
        return own + super().get_urls()

    def has_add_permission(self, request: HttpRequest, obj: Run | None = None) -> bool:
        return request.user.has_perm("cleanup.add_run")

    def has_end_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("cleanup.change_run")

    # -- start a run, and run again --------------------------------------------------

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Start a run: the form, then its confirmation, then `start_run` (as the API's start)."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        if request.method != "POST":
            return self.start_form(request, "", StepLines([]).with_blank(BLANK_LINES))
        name = request.POST.get("name", "")
        lines = StepLines.from_post(request.POST)
        again = _int(request.POST.get("again"), None)
        if "more" in request.POST:
            return self.start_form(request, name, lines.with_blank(MORE_LINES), again=again)
        if "edit" in request.POST:
            return self.start_form(request, name, lines, again=again)
        try:
            validated = runner_check(name, lines)
        except RunSpecError as exc:
            lines.take(exc.errors)
            return self.start_form(request, name, lines, errors=exc.errors, again=again)
        if "start" not in request.POST:
            return self.start_confirm(request, name, lines, validated, again)
        try:
            run = start_run(name, lines.spec, actor=actor(request))
        except RunSpecError as exc:  # what was installed changed since the confirmation
            lines.take(exc.errors)
            return self.start_form(request, name, lines, errors=exc.errors, again=again)
        said = f"Started with {len(lines.spec)} step(s)" + (f", run again from #{again}" if again else "")
        self.log_addition(request, run, said)
        self.message_user(
            request,
            format_html("Started run #{} {} with {} step(s); it begins at once.", run.pk, run.name, len(lines.spec)),
            messages.SUCCESS,
        )
        return HttpResponseRedirect(reverse("admin:cleanup_run_change", args=[run.pk]))

    def again_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        """Run again: the start form with this run's name and steps copied, to edit."""
        if not (self.has_add_permission(request) and request.user.has_perm("cleanup.view_run")):
            raise PermissionDenied
        run = self.get_object(request, str(object_id))
        if run is None:
            return self._no_such_run(request, object_id)
        steps = Step.objects.filter(run=run).order_by("position")[: validation.limit("EVENT_MAX_STEPS")]
        lines = StepLines.from_steps(steps).with_blank(1)
        return self.start_form(request, run.name, lines, again=run.pk)

    def start_form(
        self,
        request: HttpRequest,
        name: str,
        lines: StepLines,
        errors: Mapping[str, str] | None = None,
        again: int | None = None,
    ) -> TemplateResponse:
        actions, leases = installed()
        known = {a["id"] for a in actions}
        general = dict(lines.general)
        for field in ("name", "steps"):
            if errors and field in errors:
                general.pop(field, None)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Run again" if again else "Start a run",
            "name": name,
            "name_error": (errors or {}).get("name"),
            "steps_error": (errors or {}).get("steps"),
            "general": general,
            "lines": [{**line, "known": line["action"] in known} for line in lines.rows()],
            "line_count": len(lines.lines),
            "actions": actions,
            "leases": leases,
            "again": again,
            "again_name": _run_name(again),
            "max_steps": validation.limit("EVENT_MAX_STEPS"),
        }
        return TemplateResponse(request, "admin/cleanup/run/start.html", context)

    def start_confirm(
        self, request: HttpRequest, name: str, lines: StepLines, validated: list[CleanedStep], again: int | None
    ) -> TemplateResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Confirm: start this run",
            "name": name.strip(),
            "steps": [
                {
                    "position": i,
                    "action": step["action"],
                    "backend": step["backend"],
                    "params": json.dumps(step["params"], ensure_ascii=False, indent=1),
                }
                for i, step in enumerate(validated)
            ],
            "lines": lines.rows(),
            "line_count": len(lines.lines),
            "raw_name": name,
            "again": again,
            "again_name": _run_name(again),
        }
        return TemplateResponse(request, "admin/cleanup/run/start_confirm.html", context)

    # -- end now -----------------------------------------------------------------------

    def end_view(self, request: HttpRequest, object_id: int) -> HttpResponse:
        """End a running run now, giving back what it took or leaving it for later
        (`cancel_run`, as the API's cancel); its confirmation lists what will be given back."""
        if not self.has_end_permission(request):
            raise PermissionDenied
        run = self.get_object(request, str(object_id))
        if run is None:
            return self._no_such_run(request, object_id)
        run_page = HttpResponseRedirect(reverse("admin:cleanup_run_change", args=[run.pk]))
        if request.method == "POST" and "apply" in request.POST:
            cleanup = request.POST.get("cleanup", "give") != "leave"
            try:
                cancel_run(run.pk, cleanup=cleanup, actor=actor(request))
            except (RunStateError, Run.DoesNotExist) as exc:
                self.message_user(request, f"Nothing changed: {exc}.", messages.WARNING)
                return run_page
            said = "Ended now, giving back what it took" if cleanup else "Ended now, leaving what it took for later"
            self.log_change(request, run, said)
            if cleanup:
                # The pass may already have given everything back (a worker was free): say which.
                status = Run.objects.filter(pk=run.pk).values_list("cleanup_status", flat=True).first()
                said += (
                    "; its cleanup is complete"
                    if status in (CleanupStatus.COMPLETE, CleanupStatus.NOT_REQUIRED)
                    else "; its cleanup is queued and this page shows it as it goes"
                )
            self.message_user(request, f"{said}.", messages.SUCCESS)
            return run_page
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"End now: #{run.pk} {run.name}",
            "run": run,
            "refusal": None
            if run.status == RunStatus.RUNNING
            else f"run {run.pk} has already ended ({run.status}); there is nothing to end",
            **give_back_preview(run),
        }
        return TemplateResponse(request, "admin/cleanup/run/end.html", context)

    def _no_such_run(self, request: HttpRequest, object_id: int) -> HttpResponseRedirect:
        self.message_user(request, f"There is no run {object_id}.", messages.WARNING)
        return HttpResponseRedirect(reverse("admin:cleanup_run_changelist"))


def runner_check(name: str, lines: StepLines) -> list[CleanedStep]:
    """The engine's check of a run spec, with the form's own JSON errors added."""
    errors = {field: message for line in lines.errors.values() for field, message in line.items()}
    try:
        validated = validate_spec(name, lines.spec)
    except RunSpecError as exc:
        raise RunSpecError({**exc.errors, **errors}) from None
    if errors:
        raise RunSpecError(errors)
    return validated


def give_back_preview(run: Run) -> dict[str, Any]:
    """What a run's cleanup would give back now: its unresolved rows, group by group
    (the cleanup plan, capped; a step's placeholder shown only when nothing else of its
    step is recorded), and the steps that will not be performed."""
    unresolved = Resource.objects.filter(run=run, state__in=UNRESOLVED).exclude(kind=STEP_KIND)
    plan = []
    for group in cleanup_plan(run, max_rows=SHOWN_ROWS):
        things = [r for r in group["rows"] if r["kind"] != STEP_KIND]
        plan.append({**group, "rows": things, "unrecorded": not things})
    count = unresolved.count()
    return {
        "unresolved": count,
        "plan": plan,
        "plan_capped": count > SHOWN_ROWS,
        "not_performed": Step.objects.filter(run=run, status__in=[StepStatus.PENDING, StepStatus.RUNNING]).count(),
    }
