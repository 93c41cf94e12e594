"""API tokens: stored hashed, shown once, expiring, revoked with the password, throttled when guessed.

A token is django-rest-knox's: the database keeps its SHA-512 digest and its first 15
characters (the prefix the admin shows), never the token itself, which `issue` answers
once (``manage.py create_token USER [--ttl DAYS]`` prints it). It expires after
``EVENT_TOKEN_TTL_DAYS`` (30) unless made with another life. A superuser revokes one at a
time in the admin (*API tokens*); every token of a user is revoked when the user's
password changes or the user is deactivated (`revoke_on_password_or_deactivation`, wired
to the user model's saves by the app).

`TokenAuthentication` reads ``Authorization: Token <key>`` as knox does, and counts the
failures of each client address (its address as DRF's throttles see it, ``NUM_PROXIES``),
in the counters every process shares (`cleanup.limits`), twice: per address, and per
address and the key's prefix (its first 15 characters, what knox looks a token up by).
After ``EVENT_TOKEN_FAILURE_LIMIT`` failures within ``EVENT_TOKEN_FAILURE_WINDOW_S``:

- a key whose prefix failed that often from that address is answered 429 with
  ``Retry-After`` until its window has passed, the right key with that prefix too;
- from an address that failed that often, a key whose prefix is no token's is answered
  429 without being tried; a key with a stored token's prefix is still tried, so the
  consoles behind one NAT keep working while a guesser there is refused. Knowing a
  prefix (60 bits) is not knowing a token, and its own failures lock it out in turn.

A key that could never be a token (not hex, too long) fails without a query. A counters'
cache that does not answer (Redis down) counts nothing, logged, rather than refuse every
token.

A console asking again and again (a long poll's every answer) would cost each time the
token's lookup, its user's other tokens and the user's permissions: each process remembers
a token it authenticated, with its user and the user's permissions as read then, keyed by
the key's digest. The failure counts are still read first, and an expired token is not
answered from memory. A token revoked or saved, a user saved (a password change, a
deactivation) or deleted, or a permission or group changed empties the memory of the
process that made the change at once (signals), and notifies `CHANNEL` on commit. A
process whose change feed listens (`cleanup.api.waiting`: every ASGI worker that has
served the feed) hears it on its listening connection and empties its memory too, so it
may remember for ``EVENT_TOKEN_AUTH_WATCHED_S`` (60 s; a change made with no signal, an
SQL ``UPDATE``, holds within that); a process that does not listen remembers for
``EVENT_TOKEN_AUTH_MEMORY_S`` (5 s; 0 turns the memory off). What an authentication read
is remembered only if nothing was forgotten while it read (`_generation`): a change
committed meanwhile is not kept for a minute.

May import: conf, limits (and knox, DRF, Django); imported by the API's settings, the
admin's token page, the ``create_token`` command and the app's start-up.
"""

import logging
import math
import re
import time
from datetime import timedelta
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import Group
from django.core.cache import BaseCache
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model
from django.db.models.signals import m2m_changed, post_delete, post_save, pre_save
from django.utils import timezone
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from knox.crypto import hash_token
from knox.models import AuthToken
from knox.settings import CONSTANTS
from rest_framework import exceptions
from rest_framework.authentication import get_authorization_header
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from .. import limits
from ..conf import setting

logger = logging.getLogger("cleanup.tokens")

# Knox's tokens are hex (64 characters); a migrated DRF token is hex too (40).
TOKEN_SHAPE = re.compile(r"[0-9a-f]{16,128}")
FAILURES_KEY = "cleanup:token-failures:{}"
# What every process that listens (`cleanup.api.waiting`) hears when a token, a user or a
# permission changes: empty the memory of authentications.
CHANNEL = "cleanup_auth"


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
    # What the memory of authentications holds goes stale: forget it all, here and, on
    # commit, in every listening process.
    post_save.connect(changed, sender=user_model, dispatch_uid="cleanup.tokens.forget.user")
    post_delete.connect(changed, sender=user_model, dispatch_uid="cleanup.tokens.forget.user_deleted")
    post_delete.connect(changed, sender=AuthToken, dispatch_uid="cleanup.tokens.forget.token")
    post_save.connect(changed, sender=AuthToken, dispatch_uid="cleanup.tokens.forget.token_saved")
    post_delete.connect(changed, sender=Group, dispatch_uid="cleanup.tokens.forget.group")
    for through in (
        getattr(user_model, "user_permissions", None),
        getattr(user_model, "groups", None),
        Group.permissions,
    ):
        if through is not None:
            m2m_changed.connect(
                changed, sender=through.through, dispatch_uid=f"cleanup.tokens.forget.{through.through}"
            )


# A process's memory of the tokens it authenticated lately ---------------------------------

# digest of the key -> (until, by time.monotonic(); user; token row)
_remembered: dict[str, tuple[float, Any, Any]] = {}
REMEMBERED_MAX = 10_000
# Counts the times the memory was emptied: an authentication remembers what it read only if
# this did not move while it read.
_generation = 0
# Listeners of `CHANNEL` running in this process (`watching`).
_listeners = 0


def forget(**kwargs: object) -> None:
    """Empty this process's memory of authentications (a token, a user or a permission changed)."""
    global _generation
    _generation += 1
    _remembered.clear()


def changed(using: str = DEFAULT_DB_ALIAS, **kwargs: object) -> None:
    """A signal's handler: forget here, and tell every listening process (delivered on commit;
    a change rolled back tells nobody). A login's save of ``last_login`` alone changes
    nothing an authentication reads, and tells nobody."""
    if kwargs.get("update_fields") == frozenset({"last_login"}):
        return
    forget()
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [CHANNEL])


def watching(listening: bool) -> None:
    """A listener of `CHANNEL` in this process started (True) or lost its connection (False).
    Either way what is remembered is forgotten: a change told while nobody listened is missed."""
    global _listeners
    _listeners = max(0, _listeners + (1 if listening else -1))
    forget()


def memory_s() -> float:
    """How long an authentication is remembered now: 0 (off), the bound of a process that
    listens, or that of one that does not (see the module's text)."""
    seconds: int = setting("EVENT_TOKEN_AUTH_MEMORY_S")
    if seconds <= 0:
        return 0
    if _listeners > 0:
        watched: int = setting("EVENT_TOKEN_AUTH_WATCHED_S")
        return watched
    return seconds


def _recalled(digest: str) -> tuple[Any, Any] | None:
    found = _remembered.get(digest)
    if found is None:
        return None
    until, user, token = found
    if until <= time.monotonic() or (token.expiry is not None and token.expiry <= timezone.now()):
        _remembered.pop(digest, None)
        return None
    return user, token


def _remember(digest: str, user_and_token: tuple[Any, Any], seconds: float, generation: int) -> None:
    if generation != _generation:
        return  # forgotten while it was read: what was read may be what changed
    if len(_remembered) >= REMEMBERED_MAX:
        _remembered.clear()
    _remembered[digest] = (time.monotonic() + seconds, *user_and_token)


# Authentication, throttled per client address -------------------------------------------


class TooManyFailures(exceptions.Throttled):
    default_detail = "Too many failed token authentications from this address."
    default_code = "throttled"


class _Ident(BaseThrottle):
    """Only for DRF's reading of a client's address (``get_ident``)."""


def client_address(request: Request) -> str | None:
    return _Ident().get_ident(request)


def key_prefix(key: str) -> str:
    """The part of a presented key knox looks a token up by; ``-`` for a key that is no token's shape."""
    return key[: CONSTANTS.TOKEN_KEY_LENGTH] if TOKEN_SHAPE.fullmatch(key) else "-"


def _within(value: object, now: float, window: float) -> list[float]:
    times = value if isinstance(value, list) else []
    return [t for t in times if isinstance(t, int | float) and now - t < window]


class TokenAuthentication(KnoxTokenAuthentication):  # type: ignore[misc]  # knox ships no types
    """Knox's token authentication, with failures counted and bounded per client address and
    per (address, key prefix)."""

    def authenticate(self, request: Request) -> tuple[Any, Any] | None:
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != self.authenticate_header(request).encode().lower():
            return None  # not a token: session authentication, or none
        presented = header[1].decode("ascii", "replace") if len(header) == 2 else ""
        address = client_address(request)
        by_address = FAILURES_KEY.format(address)
        by_prefix = f"{by_address}:{key_prefix(presented)}"
        limit: int = setting("EVENT_TOKEN_FAILURE_LIMIT")
        window: int = setting("EVENT_TOKEN_FAILURE_WINDOW_S")
        now = time.time()
        counts: BaseCache | None = limits.counters()
        try:
            stored = counts.get_many([by_address, by_prefix]) if counts is not None else {}
        except Exception:  # a cache that is down (Redis): no lockout rather than no API
            logger.warning("the failed-token counts could not be read; not counted", exc_info=True)
            counts, stored = None, {}
        address_failures = _within(stored.get(by_address), now, window)
        prefix_failures = _within(stored.get(by_prefix), now, window)
        if len(prefix_failures) >= limit:
            raise self.refused(prefix_failures, limit, window, now)
        if len(address_failures) >= limit and not self.known_prefix(presented):
            raise self.refused(address_failures, limit, window, now)
        seconds = memory_s()
        digest = hash_token(presented) if seconds > 0 and TOKEN_SHAPE.fullmatch(presented) else None
        if digest is not None:
            recalled = _recalled(digest)
            if recalled is not None:
                return recalled
        generation = _generation
        try:
            user_and_token: tuple[Any, Any] | None = super().authenticate(request)
            if digest is not None and user_and_token is not None:
                _remember(digest, user_and_token, seconds, generation)
            return user_and_token
        except exceptions.AuthenticationFailed:
            address_failures = [*address_failures, now][-limit:]
            prefix_failures = [*prefix_failures, now][-limit:]
            if counts is not None:
                try:
                    counts.set_many({by_address: address_failures, by_prefix: prefix_failures}, window)
                except Exception:
                    logger.warning("the failed-token counts could not be written", exc_info=True)
            if len(address_failures) >= limit or len(prefix_failures) >= limit:
                logger.warning("token authentication throttled for %s: %d failures", address, limit)
            raise

    def known_prefix(self, key: str) -> bool:
        """Is the key's prefix a stored token's? (one indexed query, asked only of a locked address)"""
        prefix = key_prefix(key)
        return prefix != "-" and AuthToken.objects.filter(token_key=prefix).exists()

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
