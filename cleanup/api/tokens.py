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

from django.core.cache import cache
from django.db.models.signals import post_save, pre_save
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from knox.models import AuthToken
from knox.settings import CONSTANTS
from rest_framework import exceptions
from rest_framework.authentication import get_authorization_header
from rest_framework.throttling import BaseThrottle

from ..conf import setting

logger = logging.getLogger("cleanup.tokens")

# Knox's tokens are hex (64 characters); a migrated DRF token is hex too (40).
TOKEN_SHAPE = re.compile(r"[0-9a-f]{16,128}")
FAILURES_KEY = "cleanup:token-failures:{}"


def issue(user, ttl_days=None):
    """Make a token for ``user`` expiring in ``ttl_days`` (default ``EVENT_TOKEN_TTL_DAYS``);
    answers ``(row, key)``. The key is not stored: this is the only time it is known."""
    days = setting("EVENT_TOKEN_TTL_DAYS") if ttl_days is None else ttl_days
    return AuthToken.objects.create(user=user, expiry=timedelta(days=days))


def prefix(row):
    """What the admin shows of a token: its first characters, enough to tell two apart."""
    return f"{row.token_key[: CONSTANTS.TOKEN_KEY_LENGTH]}…"


def revoke_all(user, why):
    """Revoke every token of ``user``; answers how many."""
    count, _ = AuthToken.objects.filter(user=user).delete()
    if count:
        logger.warning("revoked %d API token(s) of %s: %s", count, user.get_username(), why)
    return count


# Revoked when the password changes or the user is deactivated --------------------------


def note_password_or_deactivation(sender, instance, raw=False, **kwargs):
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


def revoke_on_password_or_deactivation(sender, instance, created=False, raw=False, **kwargs):
    """post_save of the user model: revoke the user's tokens when `note_...` said so."""
    why = getattr(instance, "_cleanup_revoke_tokens", None)
    if why and not raw:
        revoke_all(instance, why)
    instance._cleanup_revoke_tokens = None


def connect(user_model):
    pre_save.connect(note_password_or_deactivation, sender=user_model, dispatch_uid="cleanup.tokens.note")
    post_save.connect(revoke_on_password_or_deactivation, sender=user_model, dispatch_uid="cleanup.tokens.revoke")


# Authentication, throttled per client address -------------------------------------------


class TooManyFailures(exceptions.Throttled):
    default_detail = "Too many failed token authentications from this address."
    default_code = "throttled"


class _Ident(BaseThrottle):
    """Only for DRF's reading of a client's address (``get_ident``)."""


def client_address(request):
    return _Ident().get_ident(request)


def _failures(key, now, window):
    return [t for t in cache.get(key, []) if isinstance(t, int | float) and now - t < window]


class TokenAuthentication(KnoxTokenAuthentication):
    """Knox's token authentication, with each client address's failures counted and bounded."""

    def authenticate(self, request):
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != self.authenticate_header(request).encode().lower():
            return None  # not a token: session authentication, or none
        key = FAILURES_KEY.format(client_address(request))
        limit = setting("EVENT_TOKEN_FAILURE_LIMIT")
        window = setting("EVENT_TOKEN_FAILURE_WINDOW_S")
        now = time.time()
        failures = _failures(key, now, window)
        if len(failures) >= limit:
            raise self.refused(failures, limit, window, now)
        try:
            return super().authenticate(request)
        except exceptions.AuthenticationFailed:
            failures = [*failures, now][-limit:]
            cache.set(key, failures, window)
            if len(failures) >= limit:
                logger.warning("token authentication throttled for %s: %d failures", client_address(request), limit)
            raise

    def refused(self, failures, limit, window, now):
        # The window of the oldest failure that counts must pass before the next try.
        wait = max(1, math.ceil(window - (now - failures[-limit])))
        return TooManyFailures(wait=wait)

    def authenticate_credentials(self, token):
        try:
            text = token.decode("ascii")
        except UnicodeDecodeError:
            text = ""
        if not TOKEN_SHAPE.fullmatch(text):
            raise exceptions.AuthenticationFailed("Invalid token.")
        return super().authenticate_credentials(token)
