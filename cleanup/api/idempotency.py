"""Safe retries: a POST under the API sent with an ``Idempotency-Key`` does its work once.

The first request with a key holds it (a row of `IdempotencyKey`, inserted: the unique
constraint on user and key says who won) and does the work; its answer, status, body and
``Location``, is then written to the row. Until ``EVENT_IDEMPOTENCY_TTL_S`` has passed, a
request from the same user with the same key and the same method, path and body is answered
that first answer again, with ``Idempotent-Replayed: true``, and does nothing; one with
another method, path or body is refused, 422 ``idempotency_key_reused``. A retry that
arrives while the first is still working waits for its answer (polling in short queries,
no transaction held open), up to `WAIT_S`, then answers 409 ``idempotency_key_in_use``
with ``Retry-After``.

What is not kept: an answer of 429 (a throttle or a quota: the retry is meant to be tried
again) or of 5xx, and a request that raised: the key is let go, and the next retry does
the work. A request that died while holding its key (a killed worker) leaves a hold that
ends after `HOLD_S`; a retry then takes it over with a conditional UPDATE. Expired keys
are deleted by the tick (`cleanup.runner.tick`, through `IdempotencyKey.objects.prune`).
May import: Django and DRF, the models, conf.
"""

import hashlib
import itertools
import json
import time
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.http.request import RawPostDataException
from django.template.response import SimpleTemplateResponse
from django.utils import timezone
from rest_framework import status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from ..conf import setting
from ..models import IdempotencyKey

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
MAX_KEY = 255
# What a key is made of: printable ASCII, not all spaces (a UUID is one).
KEY_PATTERN = "^[ -~]*[!-~][ -~]*$"
KEY_ALPHABET = f"1 to {MAX_KEY} printable ASCII characters (space to '~'), not all spaces"
# How long a request holds its key while it works: longer than any request may take
# (gunicorn kills a worker at 30 s), so only a dead request's hold is ever taken over.
HOLD_S = 60
# How long a retry waits for the first request's answer, and how often it looks.
WAIT_S = 10.0
POLL_S = 0.05
# The headers of an answer that are replayed with its status and body.
KEPT_HEADERS = ("Location",)


class IdempotencyKeyReused(APIException):
    status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
    default_detail = (
        "This Idempotency-Key was sent before with another request (method, path or body); "
        "a retry must send the same request, and a new request a new key."
    )
    default_code = "idempotency_key_reused"


class IdempotencyKeyInUse(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "A request with this Idempotency-Key is still being worked on; retry after a moment."
    default_code = "idempotency_key_in_use"
    wait = 1  # DRF's exception handler answers it as Retry-After


class Replay(Exception):
    """Raised by `IdempotentPosts.initial` to answer a retry with the first answer."""

    def __init__(self, response: HttpResponse) -> None:
        super().__init__("replayed")
        self.response = response


def key_of(request: Request) -> str | None:
    """The request's ``Idempotency-Key``, or None without one; 400 for one that cannot be a key."""
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not key.strip():
        raise ValidationError({HEADER: ["must not be empty or all spaces"]})
    if len(key) > MAX_KEY:
        raise ValidationError({HEADER: [f"at most {MAX_KEY} characters, got {len(key)}"]})
    # A header arrives as ISO-8859-1: each byte of a UTF-8 character reads as one past ASCII.
    beyond = next((index for index, char in enumerate(key) if not " " <= char <= "~"), None)
    if beyond is not None:
        control = key[beyond] < " " or key[beyond] == "\x7f"
        what = "a control character" if control else "past ASCII (a UTF-8 character's bytes are)"
        raise ValidationError({HEADER: [f"must be printable ASCII, as a UUID is: byte {beyond} is {what}"]})
    return key


def fingerprint(request: Request | HttpRequest) -> str:
    """What makes two requests "the same": method, path with its query, and the body.

    A JSON body counts by its value (key order and spacing aside); no body counts as ``{}``.
    """
    try:
        raw = request.body
    except RawPostDataException:
        # Already read as a form (a CSRF check): its fields stand for the body.
        raw = json.dumps(sorted(request.POST.lists())).encode()
    try:
        value = json.loads(raw) if raw.strip() else {}
        body = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    except (ValueError, UnicodeDecodeError):
        body = raw
    digest = hashlib.sha256()
    for part in ((request.method or "").encode(), request.get_full_path().encode(), body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def replay(row: IdempotencyKey) -> HttpResponse:
    response = HttpResponse(row.body, status=row.status, content_type=row.content_type or "application/json")
    for name, value in row.headers.items():
        response[name] = value
    response[REPLAYED] = "true"
    return response


def hold(user: Any, key: str, print_: str, wait_s: float | None = None) -> IdempotencyKey:
    """Hold ``key`` for this request, answering its row; or raise `Replay`, reused or in use."""
    deadline = time.monotonic() + (WAIT_S if wait_s is None else wait_s)
    for turn in itertools.count():
        if turn and time.monotonic() >= deadline:
            # Bounded whatever happens between the insert and the read (a row let go and
            # taken again, over and over): never a request that loops.
            raise IdempotencyKeyInUse()
        now = timezone.now()
        token = uuid.uuid4()
        try:
            with transaction.atomic():
                return IdempotencyKey.objects.create(
                    user=user,
                    key=key,
                    fingerprint=print_,
                    token=token,
                    locked_until=now + timedelta(seconds=HOLD_S),
                    expires_at=now + timedelta(seconds=setting("EVENT_IDEMPOTENCY_TTL_S")),
                )
        except IntegrityError:
            pass
        row: IdempotencyKey | None = IdempotencyKey.objects.filter(user=user, key=key).first()
        if row is None:
            continue  # let go, or pruned, since the insert: try again
        if row.expires_at <= now:
            IdempotencyKey.objects.filter(pk=row.pk, expires_at__lte=now).delete()
            continue
        if row.fingerprint != print_:
            raise IdempotencyKeyReused()
        if row.status is not None:
            raise Replay(replay(row))
        if row.locked_until <= now:
            # The request that held it died before answering: whoever moves the token takes it over.
            won = IdempotencyKey.objects.filter(pk=row.pk, token=row.token, status__isnull=True).update(
                token=token, locked_until=now + timedelta(seconds=HOLD_S)
            )
            if won:
                row.token = token
                return row
            continue
        if time.monotonic() >= deadline:
            raise IdempotencyKeyInUse()
        time.sleep(POLL_S)
    raise AssertionError("itertools.count() never ends")


def kept(response: HttpResponseBase) -> bool:
    """Whether an answer is kept for the key's retries: not a 429 (try again later), not a 5xx."""
    return response.status_code < 500 and response.status_code != status.HTTP_429_TOO_MANY_REQUESTS


def finish(row: IdempotencyKey, response: HttpResponseBase) -> None:
    """Write the first answer to the key's row (fenced by its token), or let the key go."""
    mine = IdempotencyKey.objects.filter(pk=row.pk, token=row.token, status__isnull=True)
    if not kept(response):
        mine.delete()
        return
    if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
        response.render()
    try:
        body = getattr(response, "content", b"").decode("utf-8")
    except UnicodeDecodeError:
        mine.delete()
        return
    headers = {name: response[name] for name in KEPT_HEADERS if name in response}
    mine.update(status=response.status_code, body=body, content_type=response.get("Content-Type", ""), headers=headers)


def let_go(row: IdempotencyKey) -> None:
    IdempotencyKey.objects.filter(pk=row.pk, token=row.token, status__isnull=True).delete()


if TYPE_CHECKING:
    _View = APIView
else:
    _View = object


class IdempotentPosts(_View):
    """A view mixin: POSTs with an ``Idempotency-Key`` are done once and replayed.

    The key is held after authentication, permissions and throttles (a refused request
    holds nothing) and before the handler.
    """

    _held_key: IdempotencyKey | None = None

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        self._held_key = None
        super().initial(request, *args, **kwargs)
        if request.method != "POST":
            return
        key = key_of(request)
        if key is not None:
            self._held_key = hold(request.user, key, fingerprint(request))

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, Replay):
            return exc.response  # type: ignore[return-value]  # the first answer, as it was kept
        return super().handle_exception(exc)

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        try:
            response = super().dispatch(request, *args, **kwargs)
        except BaseException:
            if self._held_key is not None:
                let_go(self._held_key)
            raise
        if self._held_key is not None:
            finish(self._held_key, response)
        return response


# -- the schema -------------------------------------------------------------------------

KEY_PARAMETER = {
    "in": "header",
    "name": HEADER,
    "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": MAX_KEY, "pattern": KEY_PATTERN},
    "description": (
        f"{KEY_ALPHABET}, such as a UUID; another is refused, 400 invalid. "
        "Makes the POST safe to retry: the same key with the same request within EVENT_IDEMPOTENCY_TTL_S "
        "answers the first answer again (status, body and Location) with Idempotent-Replayed: true, "
        "and does nothing twice; the same key with another request answers 422 idempotency_key_reused."
    ),
}


REPLAYED_HEADER = {
    "schema": {"type": "string", "enum": ["true"]},
    "description": "Present on a retry answered with the first answer of its Idempotency-Key.",
}
LOCATION_HEADER = {"schema": {"type": "string", "format": "uri"}, "description": "What to follow: the run, or the log."}


def document_idempotency_key(
    result: dict[str, Any], generator: object, request: object, public: bool
) -> dict[str, Any]:
    """drf-spectacular post-processing hook: the header, 409 and 422 on every POST, and the
    answers' headers (``Idempotent-Replayed``; ``Location`` on 201 and 202)."""
    for operations in result.get("paths", {}).values():
        operation = operations.get("post")
        if operation is None:
            continue
        params = operation.setdefault("parameters", [])
        if not any(p.get("in") == "header" and p.get("name") == HEADER for p in params):
            params.append(dict(KEY_PARAMETER))
        responses = operation.setdefault("responses", {})
        for code, answer in responses.items():
            if code.startswith("2"):
                headers = answer.setdefault("headers", {})
                headers.setdefault(REPLAYED, REPLAYED_HEADER)
                if code in ("201", "202"):
                    headers.setdefault("Location", LOCATION_HEADER)
        error = responses.get("403") or responses.get("401")
        content = {"content": error["content"]} if error and "content" in error else {}
        responses.setdefault(
            "422", {"description": "The Idempotency-Key was sent before with another request.", **content}
        )
        responses.setdefault(
            "409",
            {"description": "A request with this Idempotency-Key is still being worked on (Retry-After).", **content},
        )
    return result
