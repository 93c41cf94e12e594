"""Malformed input to the admin's model pages is refused with a message, never a 500.

The admin hands query parameters (list filters, search) and an action's selection
straight to the ORM: a NUL reaches PostgreSQL, which refuses it, and a selected id that
is not an id fails in the lookup. `AdminInputGuard` checks both before the view runs, for
every model admin of the site (ours, django-q2's, auth's), and sends the person back
with a message saying what was wrong. Add it to ``MIDDLEWARE`` after the message
middleware, as ``cleanup.admin.guards.AdminInputGuard``.

May import validation and serving only; nothing imports it but the ``MIDDLEWARE`` setting.
"""

from collections.abc import Callable, Sequence
from typing import Any

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Field
from django.http import HttpRequest, HttpResponseRedirect, QueryDict
from django.utils.deprecation import MiddlewareMixin

from .. import validation
from ..serving import OnTheLoop

SELECTED = "_selected_action"  # django.contrib.admin.helpers.ACTION_CHECKBOX_NAME


def query_problem(query: QueryDict) -> str | None:
    """What is wrong with a page's query parameters (filters, search), or None."""
    for key, values in query.lists():
        for text in (key, *values):
            if problem := validation.text_problem(text):
                return f"A filter or search value {problem}; the filters were cleared."
    return None


def selection_problem(model_admin: Any, values: Sequence[str]) -> str | None:
    """What is wrong with the ids an action was posted with, or None."""
    pk: Field[Any, Any] = model_admin.model._meta.pk
    low, high = connection.ops.integer_field_range(pk.get_internal_type()) if _is_integer(pk) else (None, None)
    for value in values:
        try:
            if validation.text_problem(value):
                raise ValidationError("not text")
            parsed = pk.to_python(value)
        except ValidationError:
            parsed = None
        in_range = parsed is not None and (low is None or low <= parsed) and (high is None or parsed <= high)
        if not in_range:
            shown = value[:40].encode("unicode_escape").decode()
            name = model_admin.model._meta.verbose_name
            return f"The selection was not applied: {shown!r} is not the id of a {name}."
    return None


def _is_integer(field: "Field[Any, Any]") -> bool:
    return field.get_internal_type() in connection.ops.integer_field_ranges


class AdminInputGuard(OnTheLoop, MiddlewareMixin):
    # Its work is `process_view`, for the admin's model pages; under ASGI every other view
    # passes on the event loop.
    def needs_thread(self, hook: str, request: HttpRequest, other: object = None) -> bool:
        return getattr(other, "model_admin", None) is not None

    def process_view(
        self,
        request: HttpRequest,
        view_func: Callable[..., object],
        view_args: tuple[object, ...],
        view_kwargs: dict[str, object],
    ) -> HttpResponseRedirect | None:
        model_admin = getattr(view_func, "model_admin", None)
        if model_admin is None:
            return None
        if problem := query_problem(request.GET):
            messages.error(request, problem)
            return HttpResponseRedirect(request.path)
        if request.method == "POST" and SELECTED in request.POST:
            if problem := selection_problem(model_admin, request.POST.getlist(SELECTED)):
                messages.error(request, problem)
                return HttpResponseRedirect(request.get_full_path())
        return None
