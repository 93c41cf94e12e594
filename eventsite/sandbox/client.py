"""The sandbox shards' HTTP client: each answer turned into a `Reply`, never an exception.

The module talks to a fleet of shards (`Fleet`): ``SANDBOX_SHARDS`` names them
(``north=http://…,south=http://…``), each name one of the module's backends; without it,
the fleet is one shard at ``SANDBOX_SHARD_URL`` whose backend is ``""``. There is one
`ShardClient` per shard, made on first use. Every request is made with explicit timeouts
(``SANDBOX_SHARD_TIMEOUT_MS``, 3000 by default, for each of connecting, sending and
reading) to the shard's URL, both read at the moment of the call so ``override_settings``
works. A `Reply` knows how to turn itself into the module envelope's failure: no answer
or a 5xx is worth another try later, any other 4xx is not; no answer and 502-504 also say
``unavailable``: the shard, not the request.

Each client also watches its shard's boot id (the ``X-Boot-Id`` header of every answer):
the first time it sees a new one for a URL, after having seen another, it tells the
engine with ``cleanup.registry.backend_restarted(module, backend)``, naming that shard.
May import: `cleanup.registry` (and `cleanup.envelopes`, the shapes of its answers) only, and
`eventsite.sandbox.fleet`.
"""

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.conf import settings

from cleanup import registry
from cleanup.envelopes import Failure

from .fleet import parse_shards

logger = logging.getLogger(__name__)

BOOT_HEADER = "X-Boot-Id"
DEFAULT_TIMEOUT_MS = 3_000
# Statuses that say "not now" rather than "never": worth another try, like a 5xx.
RETRYABLE_4XX = frozenset({408, 429})
# Statuses that say the shard is out as a whole (a proxy in front of a dead one, or down).
UNAVAILABLE_STATUSES = frozenset({502, 503, 504})


def shard_url() -> str:
    """``SANDBOX_SHARD_URL``: the shard of a fleet of one."""
    return str(getattr(settings, "SANDBOX_SHARD_URL", "") or "").rstrip("/")


def shards() -> dict[str, str]:
    """The fleet, ``{name: url}``, read now: ``SANDBOX_SHARDS`` (a dict, or the text the
    environment gives), else ``{"": SANDBOX_SHARD_URL}``, a fleet of one."""
    configured = getattr(settings, "SANDBOX_SHARDS", None)
    if isinstance(configured, str):
        configured = parse_shards(configured)
    if configured:
        return {str(name): str(url).rstrip("/") for name, url in dict(configured).items()}
    return {"": shard_url()}


def resolve(backend: str) -> str:
    """The name of the shard a call for ``backend`` goes to: ``backend`` itself, or, for
    ``""`` in a fleet of one named shard, that shard's name (so a call that names no
    backend reaches the only shard there is)."""
    fleet = shards()
    if backend == "" and "" not in fleet and len(fleet) == 1:
        return next(iter(fleet))
    return backend


def unknown_shard(backend: str, fleet: dict[str, str] | None = None) -> str:
    """The sentence for a backend the fleet has no shard for."""
    fleet = shards() if fleet is None else fleet
    if list(fleet) == [""]:
        return f"this site has one shard (SANDBOX_SHARD_URL), which has no name; there is no shard {backend!r}"
    names = ", ".join(sorted(fleet))
    if backend == "":
        return f"this site has several shards ({names}): a call must name one"
    return f"no shard is named {backend!r} (the shards are {names})"


def timeout_ms() -> float:
    value = getattr(settings, "SANDBOX_SHARD_TIMEOUT_MS", DEFAULT_TIMEOUT_MS)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return DEFAULT_TIMEOUT_MS
    return value


@dataclass(frozen=True)
class Reply:
    """What the shard answered: ``status`` 0 when it did not answer at all."""

    status: int = 0
    body: dict[str, Any] = field(default_factory=dict)  # the shard's JSON object
    error: str = ""
    terminal: bool = False  # a failure no later try can mend, whatever the status

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300 and not self.error

    @property
    def retryable(self) -> bool:
        """No answer, a 5xx or an unreadable answer: yes. A 4xx (but 408, 429, a session refused): no."""
        if self.terminal:
            return False
        if self.status == 409 and self.body.get("field") == "session":
            return True  # a session the shard let go of: the core's next renewal hears of it
        return not (400 <= self.status < 500) or self.status in RETRYABLE_4XX

    @property
    def unavailable(self) -> bool:
        """No answer at all, or a gateway or "down" status: the shard, not the request."""
        return not self.terminal and (self.status == 0 or self.status in UNAVAILABLE_STATUSES)

    def failure(self) -> Failure:
        """This reply as a failure envelope (call it only when ``ok`` is false).

        ``unavailable`` tells the engine the shard itself is out, so that the failure
        counts towards the module's outage rather than against the row.
        """
        envelope: Failure = {"ok": False, "error": self.error or "the shard failed", "retry": self.retryable}
        if self.unavailable:
            envelope["unavailable"] = True
        return envelope


class BootWatch:
    """Remembers the boot ids one shard answered, per URL, and reports a new one, once."""

    KEEP = 16  # ids remembered per URL: an answer delayed from before a restart is no news

    def __init__(self, module: str, backend: str = "") -> None:
        self.module = module
        self.backend = backend
        self._seen: dict[str, list[str]] = {}
        self._lock = threading.Lock()

    def observe(self, url: str, boot_id: str | None) -> bool:
        if not boot_id:
            return False
        with self._lock:
            seen = self._seen.setdefault(url, [])
            if boot_id in seen:
                return False
            seen.append(boot_id)
            del seen[: -self.KEEP]
            restarted = len(seen) > 1
        if restarted:
            logger.warning("the sandbox shard %r at %s restarted (boot id %s)", self.backend, url, boot_id)
            try:
                registry.backend_restarted(self.module, self.backend)
            except Exception:
                logger.exception("could not report the restart of the shard at %s", url)
        return restarted

    def forget(self) -> None:
        with self._lock:
            self._seen.clear()


class ShardClient:
    """``get``/``post``/``put`` against one shard of the fleet, each answering a `Reply`.

    ``backend`` is the shard's name (``""`` for a fleet of one); its URL is looked up at
    each request.
    """

    def __init__(self, module: str, backend: str = "") -> None:
        self.backend = backend
        self.boot_watch = BootWatch(module, backend)
        self._http: httpx.Client | None = None
        self._http_pid: int | None = None
        self._http_lock = threading.Lock()

    def http(self) -> httpx.Client:
        """One httpx client per process (a forked worker makes its own), shared by threads.

        ``trust_env=False``: a proxy from the environment must not sit between the
        module and a loopback shard.
        """
        with self._http_lock:
            if self._http is None or self._http_pid != os.getpid():
                self._http = httpx.Client(trust_env=False, follow_redirects=False)
                self._http_pid = os.getpid()
            return self._http

    def get(self, path: str, params: dict[str, Any] | None = None) -> Reply:
        return self.request("GET", path, params=params)

    def post(self, path: str, json: object) -> Reply:
        return self.request("POST", path, json=json)

    def put(self, path: str, json: object) -> Reply:
        return self.request("PUT", path, json=json)

    def url(self) -> tuple[str, None] | tuple[None, str]:
        """The shard's URL now, or ``(None, why not)``."""
        try:
            fleet = shards()
        except ValueError as exc:
            return None, f"SANDBOX_SHARDS cannot be used: {exc}"
        if self.backend not in fleet:
            return None, unknown_shard(self.backend, fleet)
        base = fleet[self.backend]
        if not base:
            return None, "SANDBOX_SHARD_URL is not set"
        return base, None

    def request(self, method: str, path: str, *, json: object = None, params: dict[str, Any] | None = None) -> Reply:
        base, problem = self.url()
        if base is None:
            return Reply(error=problem or "", terminal=True)
        limit_ms = timeout_ms()
        what = f"{method} {path}"
        who = f"the shard {self.backend!r}" if self.backend else "the shard"
        try:
            response = self.http().request(
                method,
                base + path,
                json=json,
                params=params,
                timeout=httpx.Timeout(limit_ms / 1000),
            )
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            setting = f"SANDBOX_SHARDS {self.backend}" if self.backend else "SANDBOX_SHARD_URL"
            return Reply(error=f"{setting}={base!r} cannot be used: {exc}", terminal=True)
        except httpx.TimeoutException:
            return Reply(error=f"{who} did not answer {what} within {limit_ms:g} ms")
        except httpx.HTTPError as exc:
            return Reply(error=f"{who} could not be reached for {what}: {str(exc) or type(exc).__name__}")
        self.boot_watch.observe(base, response.headers.get(BOOT_HEADER))
        try:
            body = response.json()
        except ValueError:
            body = None
        status = response.status_code
        if not isinstance(body, dict):
            return Reply(status=status, error=f"{who} answered {what} with {status} and no JSON object")
        if 200 <= status < 300:
            return Reply(status=status, body=body)
        message = body.get("error") if isinstance(body.get("error"), str) else ""
        if message and self.backend:
            message = f"{who}: {message}"
        return Reply(status=status, body=body, error=message or f"{who} answered {what} with {status}")


class Fleet:
    """One `ShardClient` per shard of the fleet, made on first use and kept per process."""

    def __init__(self, module: str) -> None:
        self.module = module
        self._clients: dict[str, ShardClient] = {}
        self._lock = threading.Lock()

    def client(self, backend: str = "") -> ShardClient:
        """The client of the shard a call for ``backend`` goes to (see `resolve`)."""
        name = resolve(backend)
        with self._lock:
            found = self._clients.get(name)
            if found is None:
                found = self._clients[name] = ShardClient(self.module, name)
            return found

    def names(self) -> list[str]:
        """The shards' names now, sorted (``[""]`` for a fleet of one unnamed shard)."""
        return sorted(shards())

    def forget(self) -> None:
        """Forget every boot id seen (as a fresh process would)."""
        with self._lock:
            clients = list(self._clients.values())
        for found in clients:
            found.boot_watch.forget()
