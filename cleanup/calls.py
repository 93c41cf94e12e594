"""Calling modules: under a deadline, never throwing, and classifying every answer.

This is the only place the engine reads what a module said. Each classifier turns an
untrusted answer into a verdict, and no shape a failure can take reads as success: only
a dict whose ``ok`` is exactly ``True`` is one, and then only when the rest of it has the
shape the contract promises (rule 4).
May import: conf, `logs`, `counters` and `pacing` only. Imported by everything that calls a module.
"""

import contextvars
import enum
import functools
import inspect
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Literal

from django.db import connections

from . import counters, logs, pacing
from .conf import claim_timeout_s, default_budget_ms

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answer:
    """What a call produced: the raw answer, or why there is none.

    ``still_running`` is the call itself when it outlived its budget: the module may
    still act, so whoever holds the claim for it keeps holding it until that ends.
    """

    raw: object = None
    timed_out: bool = False
    exception: str | None = None
    still_running: "Future[Answer] | None" = field(default=None, compare=False, repr=False)


def budget_of(entry: object) -> int:
    budget = getattr(entry, "budget_ms", None)
    return budget if isinstance(budget, int) and budget > 0 else default_budget_ms()


def budget_under_claim(entry: object) -> int:
    """A call's budget, cut so that it ends a second before the claim covering it expires.

    Otherwise a second worker could take the claim, and the step or the rows with it,
    while the first is still waiting for the module's answer (rule 18).
    """
    return max(1, min(budget_of(entry), claim_timeout_s() * 1000 - 1000))


class _Workers:
    """Threads that make module calls, reused from one call to the next.

    A worker is started only when none is free, so there are as many as the most calls
    ever in flight at once. A call that hangs keeps its worker and the next call gets
    another: a hung module costs a thread, never the pass.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Answer], Callable[[Answer], object]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._free = 0
        self._started = 0

    def submit(self, run: Callable[[], Answer], done: Callable[[Answer], object]) -> None:
        """Run ``run()`` on a free worker, then ``done(its result)``."""
        with self._lock:
            if self._free:
                self._free -= 1
            else:
                self._started += 1
                threading.Thread(target=self._work, name=f"module-call-{self._started}", daemon=True).start()
        self._jobs.put((run, done))

    def _work(self) -> None:
        while True:
            run, done = self._jobs.get()
            result = run()
            # Free before telling the caller, so that its next call reuses this worker.
            with self._lock:
                self._free += 1
            done(result)


_workers = _Workers()


def _after_fork() -> None:
    # A forked process (a django-q2 worker) inherits the pool's counts but none of its
    # threads: it starts with a pool of its own.
    global _workers
    _workers = _Workers()


os.register_at_fork(after_in_child=_after_fork)


class _CallFuture(Future[Answer]):
    """A call's future, with its place in the metrics (`_Metric`)."""

    metric: "_Metric"


def start(
    fn: Callable[..., object],
    *,
    what: str,
    backend: str | None = None,
    verb: str | None = None,
    module: str | None = None,
    turn_taken: bool = False,
    **kwargs: Any,
) -> Future[Answer]:
    """Start ``fn(**kwargs)`` on a worker; answers a `Future` of its `Answer`. Never raises.

    ``backend`` (which of the module's backends the call is for) is passed on as the
    keyword ``backend`` when ``fn`` takes it (`backend_kwargs`). ``verb`` and ``module``
    name the call in the metrics (`_Metric`; else they are read off ``fn`` and ``what``)
    and are not passed on. The call happens outside any database transaction of the
    caller's, on a worker with its own connections, which it closes when the call ends.

    When the action or lease ``fn`` belongs to declares ``max_rate``, the caller first waits
    for the call's turn on its backend (`pacing.wait_turn`): before the call starts, so the
    wait is no part of its budget, and the call is then made. ``turn_taken``: the caller
    already waited for it (`take_turn`), as the pass does before it marks a paced call.
    """
    future = _CallFuture()
    kwargs = {**kwargs, **backend_kwargs(fn, backend)}
    # The caller's log context (its run, module, backend, task) goes with the call.
    context = contextvars.copy_context()
    future.metric = _Metric(fn, what, backend, verb, module, logs.current())
    if not turn_taken:
        take_turn(fn, future.metric.labels["module"], backend)

    def call_in_context() -> Answer:
        return context.run(run)

    def run() -> Answer:
        began = time.monotonic()
        outcome = "ok"
        try:
            return Answer(raw=fn(**kwargs))
        except BaseException as exc:  # a module's failure is an answer, not a crash
            outcome = "error"
            logger.warning("%s raised %s: %s", what, type(exc).__name__, exc)
            return Answer(exception=f"{what} raised {type(exc).__name__}: {exc}")
        finally:
            future.metric.record(outcome, time.monotonic() - began)
            connections.close_all()

    _workers.submit(call_in_context, future.set_result)
    return future


def paced(fn: Callable[..., object]) -> bool:
    """Does the action or lease ``fn`` belongs to declare ``max_rate``?"""
    owner = getattr(fn, "__self__", None)
    return owner is not None and pacing.limits(owner) is not None


def take_turn(fn: Callable[..., object], module: str | None, backend: str | None) -> float:
    """Wait for the turn of a call to ``fn`` on ``backend`` when its action or lease declares
    ``max_rate`` (`pacing.wait_turn`); answers the seconds waited."""
    owner = getattr(fn, "__self__", None)
    if owner is None or pacing.limits(owner) is None:
        return 0.0
    name = module or getattr(owner, "module", None) or ""
    return pacing.wait_turn(owner, str(name), backend or "")


# What a module is called for, as the metrics name it.
VERBS = ("perform", "revert", "reconcile", "read", "apply", "restore", "health", "keepalive")


class _Metric:
    """A call's place in the metrics: counted once, when it answers or runs out of budget."""

    def __init__(
        self,
        fn: Callable[..., object],
        what: str,
        backend: str | None,
        verb: str | None,
        module: str | None,
        context: Mapping[str, Any],
    ) -> None:
        owner = getattr(fn, "__self__", None)
        if verb is None:
            suffix = str(what).rpartition(".")[2]
            verb = getattr(fn, "__name__", "call") if owner is not None else suffix if suffix in VERBS else "call"
        self.labels = {
            "module": module or getattr(owner, "module", None) or context.get("module") or "",
            "backend": backend if backend is not None else context.get("backend", ""),
            "verb": verb,
        }
        self._lock = threading.Lock()
        self._done = False

    def record(self, outcome: str, seconds: float) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        counters.add_all(
            [
                ("module_calls_total", {**self.labels, "outcome": outcome}, 1.0),
                *counters.observed("module_call_seconds", self.labels, seconds),
            ]
        )


def overdue(future: Future[Answer], budget_ms: int, what: str) -> Answer:
    """The answer of a call that did not end within its budget."""
    logger.warning("%s did not answer within %s ms", what, budget_ms)
    metric = getattr(future, "metric", None)
    if metric is not None:
        metric.record("timeout", budget_ms / 1000)
    return Answer(timed_out=True, exception=f"{what} did not answer within {budget_ms} ms", still_running=future)


def call(
    fn: Callable[..., object],
    *,
    budget_ms: int,
    what: str,
    backend: str | None = None,
    verb: str | None = None,
    module: str | None = None,
    **kwargs: Any,
) -> Answer:
    """Call ``fn(**kwargs)`` and wait at most ``budget_ms`` for it. Never raises.

    A module that hangs costs the caller its budget and no more; the call is abandoned,
    not stopped, which is why the module contract asks for idempotent calls.
    """
    future = start(fn, what=what, backend=backend, verb=verb, module=module, **kwargs)
    try:
        return future.result(timeout=budget_ms / 1000)
    except FutureTimeout:
        return overdue(future, budget_ms, what)


def backend_kwargs(fn: Callable[..., object], backend: str | None) -> dict[str, str]:
    """``{"backend": backend}`` for a callable that takes it, else nothing.

    A callable that names a ``backend`` parameter always gets it, ``""`` (the module's
    only backend) included; one that takes ``**kwargs`` gets it when it names one of
    several backends, so a module with one backend is called exactly as it always was.
    """
    if backend is None:
        return {}
    takes = _takes_backend(_signature_owner(fn))
    if takes == "named" or (takes == "kwargs" and backend):
        return {"backend": backend}
    return {}


def _signature_owner(fn: Callable[..., object]) -> Callable[..., object]:
    """What to read the signature of, as a cache key that outlives a bound method."""
    if inspect.ismethod(fn):
        return fn.__func__
    if inspect.isfunction(fn) or inspect.isbuiltin(fn):
        return fn
    call: Callable[..., object] = type(fn).__call__
    return call


@functools.lru_cache(maxsize=1024)
def _takes_backend(owner: Callable[..., object]) -> Literal["named", "kwargs"] | None:
    try:
        parameters = inspect.signature(owner).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.name == "backend" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters):
        return "named"
    if any(p.kind == p.VAR_KEYWORD for p in parameters):
        return "kwargs"
    return None


def backend_of(entry: object, value: object, what: str) -> tuple[str, None] | tuple[None, str]:
    """The backend an action names for its params (a lease for its target): ``""`` when it
    has no ``backend_of``; ``(None, error)`` when its answer cannot name one. Each call then
    goes to that backend alone, and its health and outages are its own (rule 31).

    Answers ``(backend, None)`` or ``(None, error)``.
    """
    fn = getattr(entry, "backend_of", None)
    if not callable(fn):
        return "", None
    try:
        backend = fn(value)
    except Exception as exc:  # a module's code is untrusted too
        return None, f"{what} could not name its backend: {type(exc).__name__}: {exc}"
    if backend is None:
        return "", None
    if not isinstance(backend, str) or not backend_name_ok(backend):
        return None, (
            f"{what} named its backend {backend!r:.100}: a backend's name is text of at most "
            f"{MAX_BACKEND} characters, without '/'"
        )
    return backend, None


def backend_name_ok(backend: object) -> bool:
    """A name the ledger can store and a URL can carry: at most ``MAX_BACKEND`` characters
    of valid text, no NUL, no ``/``, no space at either end."""
    if not isinstance(backend, str) or len(backend) > MAX_BACKEND or backend != backend.strip():
        return False
    if "\x00" in backend or "/" in backend:
        return False
    try:
        backend.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


MAX_BACKEND = 100


def _shape(raw: object) -> str:
    if raw is None:
        return "nothing"
    return f"a {type(raw).__name__}"


def _failure_text(raw: object, what: str) -> str:
    """The error a non-success answer carries, or a sentence saying what was wrong."""
    if isinstance(raw, dict):
        error = raw.get("error")
        if isinstance(error, str) and error.strip():
            return error.strip()
        if "ok" not in raw:
            return f"{what} answered a dict without `ok`"
        if raw.get("ok") is not False:
            return f"{what} answered ok={raw.get('ok')!r}, which is not true"
        return f"{what} refused without saying why"
    return f"{what} answered {_shape(raw)} instead of an envelope"


def _is_success(raw: object) -> bool:
    return isinstance(raw, dict) and raw.get("ok") is True


class Outcome(enum.StrEnum):
    DONE = "done"
    DRIFTED = "drifted"
    RETRY = "retry"
    TERMINAL = "terminal"


@dataclass(frozen=True)
class Verdict:
    """The classified answer to a revert or a restore."""

    outcome: Outcome
    error: str = ""
    failed: frozenset[str] = field(default_factory=frozenset)
    current: object = None
    # The module's own reason for each failed ref that it gave one for.
    reasons: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def terminal(cls, error: str) -> "Verdict":
        return cls(Outcome.TERMINAL, error=error)

    @classmethod
    def retry(cls, error: str) -> "Verdict":
        return cls(Outcome.RETRY, error=error)


def _failure_verdict(raw: object, what: str) -> Verdict:
    if isinstance(raw, dict) and raw.get("drifted") is True:
        current = raw.get("current")
        return Verdict(
            Outcome.DRIFTED,
            error=f"the value is now {current!r}, not what this run applied, so it was left alone",
            current=current,
        )
    error = _failure_text(raw, what)
    if isinstance(raw, dict) and raw.get("retry") is False:
        return Verdict.terminal(error)
    return Verdict.retry(error)


def classify_revert(answer: Answer, what: str, refs: Iterable[object] = ()) -> Verdict:
    """A revert's or a restore's answer as a `Verdict`.

    ``refs`` are the refs the call was asked about. ``failed`` is a list of refs, or an
    object ``{ref: reason}`` that also says why each was not given back; one that names
    anything else, or is of another shape, is a malformed answer, and a malformed answer
    is a failure to retry.
    """
    if answer.exception:
        return Verdict.retry(answer.exception)
    raw = answer.raw
    if not isinstance(raw, dict) or not _is_success(raw):
        return _failure_verdict(raw, what)
    failed = raw.get("failed", [])
    if failed is None:
        failed = []
    reasons = {}
    if isinstance(failed, dict):
        if not all(isinstance(r, str) and (v is None or isinstance(v, str)) for r, v in failed.items()):
            return Verdict.retry(f"{what} answered `failed` that is not an object of refs and reasons: {failed!r:.300}")
        reasons = {ref: reason_text(reason) for ref, reason in failed.items() if reason and reason.strip()}
        failed = list(failed)
    if not isinstance(failed, list) or not all(isinstance(r, str) for r in failed):
        return Verdict.retry(f"{what} answered `failed` that is not a list of refs: {failed!r:.300}")
    unknown = sorted(set(failed) - {str(r) for r in refs})
    if unknown:
        return Verdict.retry(f"{what} named refs it was not asked about as failed: {unknown}")
    return Verdict(Outcome.DONE, failed=frozenset(failed), reasons=reasons)


# A module's reason for one ref is kept on the row; longer ones are cut.
MAX_REASON = 500


def reason_text(text: str) -> str:
    """A module's reason as text the ledger can store: no NUL, no lone surrogate, bounded."""
    text = text.strip().replace("\x00", "\\x00").encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 1] + "…"


@dataclass(frozen=True)
class Performed:
    """The classified answer to a perform: resources on success, else an error."""

    ok: bool
    resources: tuple[dict[str, Any], ...] = ()
    error: str = ""
    retry: bool = True


def _resource_problem(index: int, item: object) -> str | None:
    if not isinstance(item, dict):
        return f"resources[{index}] is {_shape(item)}, not a dict"
    for name in ("kind", "ref"):
        value = item.get(name)
        if not isinstance(value, str) or not value.strip():
            return f"resources[{index}].{name} must be a non-empty string, got {value!r}"
    if item["kind"] in ("step", "override"):
        return f"resources[{index}].kind {item['kind']!r} is reserved for the engine"
    payload = item.get("payload", {})
    if payload is not None and not isinstance(payload, dict):
        return f"resources[{index}].payload must be a dict, got {_shape(payload)}"
    member_key = item.get("member_key", "")
    if member_key is not None and not isinstance(member_key, str):
        return f"resources[{index}].member_key must be a string, got {_shape(member_key)}"
    backend = item.get("backend")
    if backend is not None and not backend_name_ok(backend):
        return f"resources[{index}].backend must be a backend's name (text without '/'), got {backend!r:.100}"
    return None


def _refusal(answer: Answer, what: str) -> tuple[str, bool] | None:
    """``(error, retry)`` when the answer is not a success, else None.

    No answer (a timeout, an exception) is worth another try; so is any refusal that
    does not say ``retry: False`` in so many words.
    """
    if answer.exception:
        return answer.exception, True
    raw = answer.raw
    if _is_success(raw):
        return None
    return _failure_text(raw, what), not (isinstance(raw, dict) and raw.get("retry") is False)


def classify_perform(answer: Answer, what: str) -> Performed:
    refused = _refusal(answer, what)
    if refused:
        return Performed(ok=False, error=refused[0], retry=refused[1])
    raw = _success(answer)
    resources = raw.get("resources", [])
    if resources is None:
        resources = []
    if not isinstance(resources, list):
        return Performed(ok=False, error=f"{what} answered `resources` that is not a list")
    for index, item in enumerate(resources):
        problem = _resource_problem(index, item)
        if problem:
            return Performed(ok=False, error=f"{what}: {problem}")
    cleaned = tuple(
        {
            "kind": item["kind"],
            "ref": item["ref"],
            "payload": dict(item.get("payload") or {}),
            "member_key": item.get("member_key") or "",
            **({"backend": item["backend"]} if item.get("backend") is not None else {}),
        }
        for item in resources
    )
    return Performed(ok=True, resources=cleaned)


@dataclass(frozen=True)
class Reply:
    """A classified answer to a call that returns one value (read, apply, reconcile)."""

    ok: bool
    value: object = None
    error: str = ""
    retry: bool = True
    # A reconcile's refs the module could not tell about: neither in force nor gone.
    unknown: frozenset[str] = frozenset()


def _success(answer: Answer) -> dict[str, Any]:
    """The answer of a call `_refusal` passed: a dict whose ``ok`` is True."""
    assert isinstance(answer.raw, dict)
    return answer.raw


def classify_reply(answer: Answer, what: str, key: str | None = None) -> Reply:
    """Success needs ``ok is True`` and, when ``key`` is given, that key in the answer."""
    refused = _refusal(answer, what)
    if refused:
        return Reply(ok=False, error=refused[0], retry=refused[1])
    raw = _success(answer)
    if key is not None and key not in raw:
        return Reply(ok=False, error=f"{what} answered ok without `{key}`")
    return Reply(ok=True, value=raw.get(key) if key else None)


def classify_health(answer: Answer, what: str) -> Reply:
    """A ``health()`` answer: ``ok`` with the backend's boot id as ``value`` (None when it
    gave none, or none that is a short text), or a Reply whose ``ok`` is False saying why."""
    reply = classify_reply(answer, what)
    if not reply.ok:
        return reply
    boot_id = _success(answer).get("boot_id")
    if not (isinstance(boot_id, str) and 0 < len(boot_id) <= MAX_BOOT_ID and boot_id.isprintable()):
        boot_id = None
    return Reply(ok=True, value=boot_id)


MAX_BOOT_ID = 200


def classify_reconcile(answer: Answer, what: str) -> Reply:
    """The set of refs still in force, and those the module cannot tell about (``unknown``);
    or a Reply whose ``ok`` is False: "I do not know" about any of them.

    A ref named both in force and unknown makes the whole answer malformed.
    """
    reply = classify_reply(answer, what, key="in_force")
    if not reply.ok:
        return reply
    in_force = reply.value
    if not isinstance(in_force, list) or not _refs(in_force):
        return Reply(ok=False, error=f"{what} answered `in_force` that is not a list of refs")
    unknown = _success(answer).get("unknown", [])
    if unknown is None:
        unknown = []
    if not _refs(unknown):
        return Reply(ok=False, error=f"{what} answered `unknown` that is not a list of refs")
    both = sorted(set(in_force) & set(unknown))
    if both:
        return Reply(ok=False, error=f"{what} answered refs both in force and unknown: {both[:10]}")
    return Reply(ok=True, value=frozenset(in_force), unknown=frozenset(unknown))


def _refs(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(r, str) for r in value)


def classify_keepalive(answer: Answer, what: str) -> Reply:
    """A ``keepalive`` answer: ``ok`` with ``value`` None (renewed), or with the lapse the
    backend's switch reports, ``{"at", "silent_s", "given_back": [refs], "kept": {ref:
    reason}}`` (rule 34); or a Reply whose ``ok`` is False. A lapse in any other shape is a
    failure: what was given back must never be guessed."""
    reply = classify_reply(answer, what)
    if not reply.ok:
        return reply
    lapsed = _success(answer).get("lapsed")
    if lapsed is None:
        return Reply(ok=True)
    bad = Reply(ok=False, error=f"{what} answered a lapse that is not {{given_back: [refs], kept: {{ref: reason}}}}")
    if not isinstance(lapsed, dict):
        return bad
    given, kept = lapsed.get("given_back", []), lapsed.get("kept", {})
    if not _refs(given) or not isinstance(kept, dict) or not all(isinstance(k, str) for k in kept):
        return bad
    at, silent = lapsed.get("at"), lapsed.get("silent_s")
    return Reply(
        ok=True,
        value={
            "at": at if isinstance(at, str) else None,
            "silent_s": silent if isinstance(silent, int | float) and not isinstance(silent, bool) else None,
            "given_back": list(given),
            "kept": {ref: reason_text(str(why)) for ref, why in kept.items() if ref not in set(given)},
        },
    )
