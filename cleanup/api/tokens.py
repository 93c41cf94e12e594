"""API tokens: stored hashed, shown once, expiring, revoked with the password, throttled when guessed.

A token is django-rest-knox's: the database keeps its SHA-512 digest and its first 15
characters (the prefix the admin shows), never the token itself, which `issue` answers
once (``manage.py create_token USER [--ttl DAYS]`` prints it). It expires after
``EVENT_TOKEN_TTL_DAYS`` (30) unless made with another life. A superuser revokes one at a
time in the admin (*API tokens*); every token of a user is revoked when the user's
password changes or the user is deactivated (`revoke_on_password_or_deactivation`, wired
to the user model's saves by the app).

`TokenAuthentication` reads ``Authorization: Token <key>`` as knox does, and counts the
failures of each client address (its address as DRF's throttles see it, ``NUM_PROXIES``):
after ``EVENT_TOKEN_FAILURE_LIMIT`` within ``EVENT_TOKEN_FAILURE_WINDOW_S`` its token
requests are answered 429 with ``Retry-After`` until the window has passed, the right
token included. A key that could never be a token (not hex, too long) fails without a
query.

May import: conf (and knox, DRF, Django); imported by the API's settings, the admin's
token page, the ``create_token`` command and the app's start-up.
"""

import logging
import math
import re
import time
from datetime import timedelta
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.cache import cache
from django.db.models import Model
from django.db.models.signals import post_save, pre_save
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from knox.models import AuthToken
from knox.settings import CONSTANTS
from rest_framework import exceptions
from rest_framework.authentication import get_authorization_header
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from ..conf import setting

logger = logging.getLogger("cleanup.tokens")

# Knox's tokens are hex (64 characters); a migrated DRF token is hex too (40).
TOKEN_SHAPE = re.compile(r"[0-9a-f]{16,128}")
FAILURES_KEY = "cleanup:token-failures:{}"


def issue(user: AbstractBaseUser, ttl_days: int | None = None) -> tuple[Any, str]:
    """Make a token for ``user`` expiring in ``ttl_days`` (default ``EVENT_TOKEN_TTL_DAYS``);
    answers ``(row, key)``. The key is not stored: this is the only time it is known."""
    days: int = setting("EVENT_TOKEN_TTL_DAYS") if ttl_days is None else ttl_days
    made: tuple[Any, str] = AuthToken.objects.create(user=user, expiry=timedelta(days=days))
    return made


def prefix(row: Any) -> str:
    """What the admin shows of a token: its first characters, enough to tell two apart."""
    return f"{row.token_key[: CONSTANTS.TOKEN_KEY_LENGTH]}…"


def revoke_all(user: AbstractBaseUser, why: str) -> int:
    """Revoke every token of ``user``; answers how many."""
    count: int
    count, _ = AuthToken.objects.filter(user=user).delete()
    if count:
        logger.warning("revoked %d API token(s) of %s: %s", count, user.get_username(), why)
    return count


# Revoked when the password changes or the user is deactivated --------------------------


def note_password_or_deactivation(sender: type[Model], instance: Any, raw: bool = False, **kwargs: object) -> None:
    """pre_save of the user model: remember whether this save changes the password or
    deactivates the user (read from the row as stored, so any path that saves counts)."""
    instance._cleanup_revoke_tokens = None
    if raw or instance.pk is None:
        return
    stored = sender._default_manager.filter(pk=instance.pk).values("password", "is_active").first()
    if stored is None:
        return
    if stored["password"] != instance.password:
        instance._cleanup_revoke_tokens = "the password changed"
    elif stored["is_active"] and not instance.is_active:
        instance._cleanup_revoke_tokens = "the user was deactivated"


def revoke_on_password_or_deactivation(
    sender: type[Model], instance: Any, created: bool = False, raw: bool = False, **kwargs: object
) -> None:
    """post_save of the user model: revoke the user's tokens when `note_...` said so."""
    why = getattr(instance, "_cleanup_revoke_tokens", None)
    if why and not raw:
        revoke_all(instance, why)
    instance._cleanup_revoke_tokens = None


def connect(user_model: type[Model]) -> None:
    pre_save.connect(note_password_or_deactivation, sender=user_model, dispatch_uid="cleanup.tokens.note")
    post_save.connect(revoke_on_password_or_deactivation, sender=user_model, dispatch_uid="cleanup.tokens.revoke")


# Authentication, throttled per client address -------------------------------------------


class TooManyFailures(exceptions.Throttled):
    default_detail = "Too many failed token authentications from this address."
    default_code = "throttled"


class _Ident(BaseThrottle):
    """Only for DRF's reading of a client's address (``get_ident``)."""


def client_address(request: Request) -> str | None:
    return _Ident().get_ident(request)


def _failures(key: str, now: float, window: float) -> list[float]:
    return [t for t in cache.get(key, []) if isinstance(t, int | float) and now - t < window]


class TokenAuthentication(KnoxTokenAuthentication):  # type: ignore[misc]  # knox ships no types
    """Knox's token authentication, with each client address's failures counted and bounded."""

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != self.authenticate_header(request).encode().lower():
            return None  # not a token: session authentication, or none
        key = FAILURES_KEY.format(client_address(request))
        limit: int = setting("EVENT_TOKEN_FAILURE_LIMIT")
        window: int = setting("EVENT_TOKEN_FAILURE_WINDOW_S")
        now = time.time()
        failures = _failures(key, now, window)
        if len(failures) >= limit:
            raise self.refused(failures, limit, window, now)
        try:
            user_and_token: tuple[Any, Any] | None = super().authenticate(request)
            return user_and_token
        except exceptions.AuthenticationFailed:
            failures = [*failures, now][-limit:]
            cache.set(key, failures, window)
            if len(failures) >= limit:
                logger.warning("token authentication throttled for %s: %d failures", client_address(request), limit)
            raise

    def refused(self, failures: list[float], limit: int, window: float, now: float) -> TooManyFailures:
        # The window of the oldest failure that counts must pass before the next try.
        wait = max(1, math.ceil(window - (now - failures[-limit])))
        return TooManyFailures(wait=wait)

    def authenticate_credentials(self, token: bytes) -> tuple[Any, Any]:
        try:
            text = token.decode("ascii")
        except UnicodeDecodeError:
            text = ""
        if not TOKEN_SHAPE.fullmatch(text):
            raise exceptions.AuthenticationFailed("Invalid token.")
        user_and_token: tuple[Any, Any] = super().authenticate_credentials(token)
        return user_and_token
