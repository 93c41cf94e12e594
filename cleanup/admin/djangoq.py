"""django-q2's admin pages, for superusers only to change.

A schedule names any function by its dotted path (its free ``func`` field), and a task
resubmitted from the admin runs its function again: whoever adds or changes a schedule,
edits the ORM broker's queue or resubmits a task runs code. So, whatever permissions a
staff user was given, only an active superuser may add, change or delete django-q2's
schedules, tasks and queued messages, or use their actions; other staff with the view
permission may read them.

May import: nothing of the app (Django's and django-q2's admin only); imported by the admin package.
"""

from typing import TYPE_CHECKING, Any

import django_q.admin  # noqa: F401  (registers django-q2's pages first, whatever the order of the apps)
from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest
from django_q.models import Failure, OrmQ, Schedule, Success

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]
else:
    _ModelAdmin = object


def superuser(request: HttpRequest) -> bool:
    user = request.user
    return bool(user and user.is_active and user.is_superuser)


class SuperusersChange(_ModelAdmin):
    """Mixed in before django-q2's own model admin."""

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return superuser(request) and super().has_add_permission(request, *args)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return superuser(request) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return superuser(request) and super().has_delete_permission(request, obj)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        return super().get_actions(request) if superuser(request) else {}


def guard(model: type[Model]) -> None:
    """Register ``model`` again with its django-q2 admin, for superusers only to change."""
    if not admin.site.is_registered(model):
        return
    original = type(admin.site.get_model_admin(model))
    admin.site.unregister(model)
    admin.site.register(
        model, type(f"Superuser{original.__name__}", (SuperusersChange, original), {"__module__": __name__})
    )


for _model in (Schedule, Success, Failure, OrmQ):
    guard(_model)
