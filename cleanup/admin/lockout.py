"""Logins that guess: the lockout's limits, and its pages in the admin.

django-axes counts failed logins per (username, client address) (the site's ``AXES_*``
settings name the functions below, so that ``EVENT_LOGIN_FAILURE_LIMIT`` and
``EVENT_LOGIN_COOLOFF_S`` are read at the moment of use). After that many failures the
username is refused from that address for the cool-off, even with the right password;
from another address it still logs in, so five wrong passwords from anywhere cannot lock
the superuser out. `LockoutHandler` adds a bound per address whatever the usernames: past
``EVENT_LOGIN_ADDRESS_FAILURE_LIMIT`` failures within the cool-off, every login from that
address is refused (one address trying many usernames). Either way the login page says so
(``admin/cleanup/lockout.html``, answered 429). Axes keeps its counts in the database, so
every process counts them together. Every failure is logged (logger ``axes``)
and listed in the admin's *Access failures*; *Access attempts* lists the usernames that
are counting or locked out, and only a superuser may lift a lockout there (the action
*Lift the lockout*, or deleting the row), which is logged too.

May import: conf; nothing imports it but the admin package and the ``AXES_*`` settings.
"""

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from axes.admin import AccessAttemptAdmin, AccessFailureLogAdmin, AccessLogAdmin
from axes.backends import AxesStandaloneBackend
from axes.handlers.database import AxesDatabaseHandler
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib import admin
from django.db.models import QuerySet, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from ..conf import setting

logger = logging.getLogger("cleanup.lockout")

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[Any]
else:
    _ModelAdmin = object


def failure_limit(request: HttpRequest | None = None, credentials: object = None) -> int:
    """``AXES_FAILURE_LIMIT``: failed logins after which a username is locked out."""
    limit: int = setting("EVENT_LOGIN_FAILURE_LIMIT")
    return limit


def cooloff(request: HttpRequest | None = None) -> timedelta:
    """``AXES_COOLOFF_TIME``: how long a locked-out username stays locked out."""
    return timedelta(seconds=setting("EVENT_LOGIN_COOLOFF_S"))


def address_limit() -> int:
    """Failed logins from one address, whatever the usernames, after which it is refused."""
    limit: int = setting("EVENT_LOGIN_ADDRESS_FAILURE_LIMIT")
    return limit


def address_failures(address: str | None) -> int:
    """Failed logins from ``address`` within the cool-off, every username's."""
    if not address:
        return 0
    since = timezone.now() - cooloff()
    found = AccessAttempt.objects.filter(ip_address=address, attempt_time__gte=since).aggregate(
        total=Sum("failures_since_start")
    )
    return int(found["total"] or 0)


class LockoutHandler(AxesDatabaseHandler):  # type: ignore[misc]  # django-axes has no types
    """``AXES_HANDLER``: django-axes' database handler, counting per (username, address) as
    ``AXES_LOCKOUT_PARAMETERS`` says, and refusing an address past `address_limit()`."""

    def is_locked(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> bool:
        if super().is_locked(request, credentials):
            return True
        return self._address_locked(request)

    def user_login_failed(
        self, sender: object, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
    ) -> None:
        super().user_login_failed(sender, credentials, request, **kwargs)
        if request is not None and not getattr(request, "axes_locked_out", False) and self._address_locked(request):
            request.axes_locked_out = True  # type: ignore[attr-defined]  # django-axes' mark, read by its middleware
            request.axes_credentials = credentials  # type: ignore[attr-defined]

    def _address_locked(self, request: HttpRequest) -> bool:
        address = getattr(request, "axes_ip_address", None)
        failures = address_failures(address)
        if failures < address_limit():
            return False
        if not getattr(request, "cleanup_address_locked", False):
            logger.warning("logins from %s refused: %d failed logins across usernames", address, failures)
        request.cleanup_address_locked = True  # type: ignore[attr-defined]  # read by lockout_response
        return True


class LockoutBackend(AxesStandaloneBackend):  # type: ignore[misc]  # django-axes has no types
    """django-axes' backend, first in ``AUTHENTICATION_BACKENDS``: refuses a locked-out
    username. A login with no request (a shell, the test client's ``login``) comes from no
    client address and is left to the next backend, as without axes; every login over HTTP
    (the admin's form, DRF) passes its request."""

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> Any:
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None = None, credentials: object = None
) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: the page a locked-out username gets, 429 with ``Retry-After``."""
    seconds: int = setting("EVENT_LOGIN_COOLOFF_S")
    context = {
        "by_address": getattr(request, "cleanup_address_locked", False),
        "address_limit": address_limit(),
        "failure_limit": failure_limit(),
        "cooloff_minutes": max(1, round(seconds / 60)),
        "site_header": admin.site.site_header,
        "site_title": admin.site.site_title,
    }
    response = render(request, "admin/cleanup/lockout.html", context, status=429)
    response["Retry-After"] = str(seconds)
    return response


class SuperuserLifts(_ModelAdmin):
    """Nobody adds or edits these rows; only a superuser deletes one (lifts a lockout)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_active and request.user.is_superuser


class AttemptAdmin(SuperuserLifts, AccessAttemptAdmin):  # type: ignore[misc]  # django-axes has no types
    list_display = ["attempt_time", "username", "ip_address", "path_info", "failures_since_start", "locked_out"]
    list_filter = ["attempt_time"]
    actions = ["lift"]

    @admin.display(description="locked out", boolean=True)
    def locked_out(self, obj: Any) -> bool:
        return bool(obj.failures_since_start >= failure_limit())

    @admin.action(description="Lift the lockout", permissions=["delete"])
    def lift(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        names = sorted({attempt.username or "" for attempt in queryset})
        count, _ = queryset.delete()
        logger.warning("lockout lifted by %s for %s", request.user.get_username(), ", ".join(map(repr, names)))
        self.message_user(request, f"Lifted the lockout of {len(names)} username(s): {', '.join(names)}.")

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        logger.warning("lockout lifted by %s for %r", request.user.get_username(), obj.username)
        super().delete_model(request, obj)


class FailureLogAdmin(SuperuserLifts, AccessFailureLogAdmin):  # type: ignore[misc]  # django-axes has no types
    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class LogAdmin(SuperuserLifts, AccessLogAdmin):  # type: ignore[misc]  # django-axes has no types
    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


for _model, _admin in ((AccessAttempt, AttemptAdmin), (AccessFailureLog, FailureLogAdmin), (AccessLog, LogAdmin)):
    if admin.site.is_registered(_model):
        admin.site.unregister(_model)
    admin.site.register(_model, _admin)
