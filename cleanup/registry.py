"""The module registry: the public API through which a module plugs into events.

A module is a Django app. In its ``AppConfig.ready()`` it registers its actions and
leases::

    from cleanup import registry

    class SpawnAction(registry.Action):
        id = "mymodule.spawn"
        module = "mymodule"
        budget_ms = 5_000

        def perform(self, *, run_id, step_id, params, idempotency_key): ...
        def revert(self, *, run_id, resources, idempotency_key): ...

    registry.register_action(SpawnAction())

Every callable takes keyword arguments and answers a dict, the *envelope*. The engine
trusts no answer: only a dict whose ``ok`` is exactly ``True`` is success. ``None``, a
list, a string, ``{"ok": "yes"}``, ``{"ok": 1}``, an exception or a call that outlives
its budget are all failures. A call that is still running when its budget ends is
abandoned, not cancelled: it may still land on the backend, which is why every call
carries an idempotency key or an expected value.

Failure envelopes, for every call: ``{"ok": False, "error": "what went wrong",
"retry": True}`` (transient: tried again after a backoff) or ``"retry": False``
(terminal: left for a person). A lease restore, or a revert, that finds somebody else's
value in place answers ``{"ok": False, "drifted": True, "current": value}``: the engine
leaves it alone and shows it to a person.

The shapes of these envelopes are spelled as types in `cleanup.envelopes` (``PerformAnswer``,
``RevertAnswer``, ...), and the signatures below use them. They are for a module author's
type checker only: the engine still trusts no answer at run time, and every answer is
classified in `cleanup.calls` whatever its type says.

Helpers keep a module's callables to the contract: `never_raises` turns an exception into
a failure envelope to try again, `terminal` spells the failure only a person can help with
(a bad parameter, a target the backend does not have) and `retry` the one worth trying
again; `refs_of` reads the refs a ``revert`` or a ``reconcile`` is handed, `chunks` splits
them into requests, and `lapsed` spells a ``keepalive``'s answer when the session lapsed.
May import: `enqueue` and `envelopes` only, so that a module importing it brings nothing of
the engine with it.
"""

import base64
import functools
import hashlib
import logging
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, ParamSpec, Protocol, TypeVar, cast

from django.dispatch import Signal

from .enqueue import queue_reconcile
from .envelopes import (
    ApplyAnswer,
    Failure,
    HealthAnswer,
    KeepaliveOk,
    PerformAnswer,
    ReadAnswer,
    ReconcileAnswer,
    RecordedResource,
    RestoreAnswer,
    RevertAnswer,
)

logger = logging.getLogger(__name__)


class RegistryError(ValueError):
    """A module tried to register something the registry cannot accept."""


class Revert(Protocol):
    """The signature of an action's ``revert``."""

    def __call__(self, *, run_id: int, resources: list[RecordedResource], idempotency_key: str) -> RevertAnswer: ...


class Reconcile(Protocol):
    """The signature of an action's ``reconcile``."""

    def __call__(self, *, run_id: int, resources: list[RecordedResource]) -> ReconcileAnswer: ...


class Health(Protocol):
    """The signature of a module's ``health`` (on any of its actions or leases)."""

    def __call__(self, *, backend: str = ...) -> HealthAnswer: ...


class Action:
    """An action a step can perform. Subclass it, set ``id`` and ``module``.

    Any object (or class) with the same attributes may be registered instead. ``id``,
    ``module`` and ``perform`` are required: `register_action` refuses an entry without one,
    naming it. Every other attribute below is optional (`ACTION_OPTIONAL`): one the entry
    lacks is unset, ``None``, exactly as here.

    ``id``: unique, conventionally ``"<module>.<verb>"``. ``module``: the module's name,
    written on every ledger row the action makes. ``budget_ms``: the deadline of each
    call (the ``EVENT_DEFAULT_BUDGET_MS`` setting when unset). ``max_concurrency``: how
    many of its ``revert`` calls a cleanup pass may have in flight at once, for a backend
    that cannot take ``EVENT_CALL_CONCURRENCY`` (the default) calls together; two calls
    for one group never overlap, whatever the limit.

    ``perform(*, run_id, step_id, params, idempotency_key)`` does the step and answers
    ``{"ok": True, "resources": [{"kind": str, "ref": str, "payload": dict?,
    "member_key": str?}, ...]}``, one entry per thing it created in the world. The same
    ``idempotency_key`` may arrive twice (a retry after a timeout, a worker that died):
    doing the work once per key is the module's job.

    ``revert(*, run_id, resources, idempotency_key)`` (optional, but without it nothing
    the action made can be given back) gives back a list of resources, each
    ``{"kind", "ref", "payload", "member_key"}``, all made by one step, whose
    ``idempotency_key`` it receives: the list may be empty when the step's worker died
    before it could record what it made, so a module should give back whatever it made
    under that key. It answers ``{"ok": True, "failed": [refs]}``, or ``{"ok": True,
    "failed": {ref: reason}}`` to say why each was not given back (each row then shows
    its own reason): every ref not in ``failed`` is taken as given back, and a thing that
    was already gone counts as given back. ``failed`` may name only refs of the list. When what it would give back was
    changed by somebody else (a player tamed the creature), it may answer ``{"ok": False,
    "drifted": True, "current": value}``: every row of the call is then left alone as
    ``drifted`` for a person, never retried automatically; for one thing among many,
    prefer naming it in ``failed``. The step's ``step`` placeholder row is never in the
    list; ``idempotency_key`` is the step's key (for a row whose step was deleted, the
    ``idempotency_key`` of the row's payload when the module put one there, else its ref).
    A row's ``payload`` and ``member_key`` are handed back exactly as ``perform`` answered
    them: the engine keeps its own data (the action that made the row) apart.

    ``reconcile(*, run_id, resources)`` (optional) answers which of the listed resources
    are still in the world: ``{"ok": True, "in_force": [refs]}``. Refs left out are
    recorded as gone (``orphaned``), so a ref the backend never heard of is gone too.
    Refs it cannot tell about go in ``"unknown": [refs]`` and are left as they are; answer
    a failure when it cannot tell about any: not knowing must never read as "gone".

    ``validate(params)`` (optional) raises ``ValueError`` with a message naming the bad
    field; it runs before a run is stored.

    ``health(*, backend)`` (optional, on any one action or lease of the module) answers
    ``{"ok": True, "boot_id": "..."}`` when the backend answers, or a failure (with
    ``"unavailable": True`` when it is down). While the backend is marked down the engine
    probes it instead of letting one ordinary call through; while it is up and holds
    something, the engine asks it at least every ``EVENT_BACKEND_WATCH_S``, and a boot id
    other than the last one it saw is a restart: the backend owes a reconcile, made at the
    next tick if a worker has not made it sooner (see `cleanup.outages`).

    **Backends.** A module may serve several backends (shards, realms, servers).
    ``backend_of(params)`` names the backend a step acts on (default ``""``, the module's
    only backend); a resource in ``perform``'s answer may carry its own ``"backend"``.
    Every callable that names a ``backend`` keyword is called with it (``perform``,
    ``revert``, ``reconcile``, ``health``), ``""`` included; one that takes ``**kwargs``
    gets it when there are several. Health, outages, restarts, ``max_concurrency`` and
    reconcile are per backend: a backend that is down holds only its own work. A revert
    of an empty list goes to its step's backend.
    """

    id: str | None = None
    module: str | None = None
    budget_ms: int | None = None
    max_concurrency: int | None = None
    max_rate: float | None = None
    max_burst: int | None = None
    revert: Revert | None = None
    reconcile: Reconcile | None = None
    validate: Callable[[dict[str, Any]], object] | None = None
    health: Health | None = None

    def perform(self, *, run_id: int, step_id: int, params: dict[str, Any], idempotency_key: str) -> PerformAnswer:
        raise NotImplementedError

    def backend_of(self, params: dict[str, Any]) -> str:
        """The backend a step with these params acts on: ``""``, the module's only one."""
        return ""


class Lease:
    """A temporary override of a live property, such as a spawner's rate.

    As for an `Action`, any object with the same attributes may be registered instead:
    ``id``, ``module``, ``read``, ``apply`` and ``restore`` are required (`register_lease`
    refuses an entry without one, naming it); the others are optional (`LEASE_OPTIONAL`),
    unset (``None``) when the entry lacks them.

    ``read(*, target)`` answers ``{"ok": True, "value": v}``, the value in force now.
    ``apply(*, value, run_id, target)`` sets it and answers ``{"ok": True}``.
    ``restore(*, baseline, expected, run_id, target)`` puts ``baseline`` back only if
    the value in force is still ``expected`` (what this run applied) and answers
    ``{"ok": True}``, also when the value already is the baseline. When somebody else's
    value is in place it answers ``{"ok": False, "drifted": True, "current": value}``
    and changes nothing.

    ``validate(value)`` (optional) raises ``ValueError`` with a message when the lease
    cannot apply ``value``; ``core.lease`` calls it before a run is stored. ``health()``
    (optional) is as for an `Action`. ``backend_of(target)`` names the backend that holds
    the target (default ``""``); the same target on two backends is two targets, each
    with its own stack of leases (rule 13). After a backend restart the engine reads each
    open lease's target: one whose baseline is back in force is settled as ``orphaned``
    ("the backend no longer holds this override"), and its baseline goes to the next
    newer lease on the target.

    The engine records the lease in the ledger (kind ``override``, ref
    ``"<lease id>#<target>"``, payload ``{"baseline", "applied"}``) before it calls
    ``apply``; several runs may lease one target at once, and the engine stacks them.
    """

    id: str | None = None
    module: str | None = None
    budget_ms: int | None = None
    max_concurrency: int | None = None
    max_rate: float | None = None
    max_burst: int | None = None
    value_type: Callable[[Any], Any] | None = None
    validate: Callable[[Any], object] | None = None
    health: Health | None = None

    def read(self, *, target: str) -> ReadAnswer:
        raise NotImplementedError

    def apply(self, *, value: Any, run_id: int, target: str) -> ApplyAnswer:
        raise NotImplementedError

    def restore(self, *, baseline: Any, expected: Any, run_id: int, target: str) -> RestoreAnswer:
        raise NotImplementedError

    def backend_of(self, target: str) -> str:
        """The backend that holds this target: ``""``, the module's only one."""
        return ""


_Params = ParamSpec("_Params")
_Answer = TypeVar("_Answer")


def never_raises(method: Callable[_Params, _Answer]) -> Callable[_Params, _Answer | Failure]:
    """Decorate a module callable so that an exception it raises becomes a failure to retry.

    The exception is logged with its traceback (on the logger of the module that defines
    the callable) and answered as ``{"ok": False, "error": "<id> <method> failed:
    <ExceptionType>: <message>", "retry": True}``, where ``<id>`` is the ``id`` of the
    action or lease it is called on. The engine would survive the exception too, but a
    module that answers for itself shows staff a sentence that names the call. The
    wrapper keeps the callable's signature (`functools.wraps`), which the engine reads to
    see whether it takes ``backend``::

        class Spawn(registry.Action):
            @registry.never_raises
            def perform(self, *, run_id, step_id, params, idempotency_key):
                if not params.get("creature"):
                    return registry.terminal("creature must be named")
                ...
    """
    log = logging.getLogger(method.__module__)
    name = method.__name__

    @functools.wraps(method)
    def wrapper(*args: _Params.args, **kwargs: _Params.kwargs) -> _Answer | Failure:
        try:
            return method(*args, **kwargs)
        except Exception as exc:
            owner = getattr(args[0], "id", None) if args else None
            called = f"{owner} {name}" if isinstance(owner, str) and owner else getattr(method, "__qualname__", name)
            log.exception("%s failed", called)
            return {"ok": False, "error": f"{called} failed: {type(exc).__name__}: {exc}", "retry": True}

    return wrapper


def terminal(error: str) -> Failure:
    """A failure only a person can help with: ``{"ok": False, "error": error, "retry": False}``.

    Answer it when asking again cannot succeed (a bad parameter, a target or a backend the
    module does not know, a request the backend refused for good); the row or step then
    waits for a person with ``error`` shown beside it, and no attempt is spent on it again.
    """
    return {"ok": False, "error": error, "retry": False}


def retry(error: str, *, unavailable: bool = False) -> Failure:
    """A failure to try again after a backoff: ``{"ok": False, "error": error, "retry": True}``.

    Answer it when the same request may succeed later (the backend answered something it
    should not, or not yet what it should); with ``unavailable=True`` (``"unavailable":
    True``) when the backend itself is out, so that the answer counts towards its outage.
    """
    failure: Failure = {"ok": False, "error": error, "retry": True}
    if unavailable:
        failure["unavailable"] = True
    return failure


def refs_of(resources: object) -> list[str]:
    """The refs of the resources a ``revert`` or a ``reconcile`` is handed, each once, in order.

    Raises ``ValueError`` naming what is wrong when ``resources`` is not a list of entries
    that each carry a non-empty string ``ref``: answer it `terminal`, as asking again with
    the same list cannot help.
    """
    if not isinstance(resources, list | tuple):
        raise ValueError(f"resources must be a list, not {type(resources).__name__}")
    refs = []
    for item in resources:
        ref = item.get("ref") if isinstance(item, dict) else None
        if not isinstance(ref, str) or not ref.strip():
            raise ValueError(f"a resource without a ref: {item!r}")
        refs.append(ref)
    return list(dict.fromkeys(refs))


_Item = TypeVar("_Item")


def chunks(items: Sequence[_Item], size: int) -> list[list[_Item]]:
    """``items`` in lists of at most ``size``, in order: one request each, for a backend that
    takes only so many refs at a time (no list for no items)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive whole number, not {size!r}")
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def lapsed(*, given_back: list[str], kept: dict[str, str], at: object = None, silent_s: object = None) -> KeepaliveOk:
    """A ``keepalive``'s answer when the session had lapsed: the backend's switch gave back
    ``given_back`` and kept ``kept`` (``{ref: why}``), both ledger refs.

    ``at`` is when the switch went off, in seconds since the epoch as a backend keeps time
    (answered in ISO 8601), and ``silent_s`` how long it had heard nothing; ``None`` for
    either when the backend cannot tell (a value that is no number reads as ``None`` too).
    """
    return {
        "ok": True,
        "lapsed": {
            "at": datetime.fromtimestamp(at, UTC).isoformat() if isinstance(at, int | float) else None,
            "silent_s": float(silent_s) if isinstance(silent_s, int | float) else None,
            "given_back": list(given_back),
            "kept": dict(kept),
        },
    }


ActionT = TypeVar("ActionT", bound=Action)
LeaseT = TypeVar("LeaseT", bound=Lease)

# What an action or a lease must have: one without any of them is refused when it registers.
ACTION_REQUIRED = ("id", "module", "perform")
LEASE_REQUIRED = ("id", "module", "read", "apply", "restore")
# What it may leave out: missing reads as unset (``None``), exactly as on an `Action` or a
# `Lease` that does not set it. The registry sets each one the entry lacks to ``None`` when it
# registers (`_fill_optional`), so the engine, and anybody else, may read any of them off a
# registered entry; ``keepalive`` is the dead-man's switch's (docs/modules.md).
ACTION_OPTIONAL = (
    "budget_ms",
    "max_concurrency",
    "max_rate",
    "max_burst",
    "revert",
    "reconcile",
    "validate",
    "health",
    "backend_of",
    "keepalive",
)
LEASE_OPTIONAL = (
    "budget_ms",
    "max_concurrency",
    "max_rate",
    "max_burst",
    "value_type",
    "validate",
    "health",
    "backend_of",
    "keepalive",
)

_actions: dict[str, Action] = {}
_leases: dict[str, Lease] = {}


def _named(entry: Any, kind: str) -> str:
    """How a refusal names an entry: ``action 'x.spawn' (mymodule.module.Spawn)``, or by its
    class alone when it has no usable id."""
    cls = entry if isinstance(entry, type) else type(entry)
    where = f"{cls.__module__}.{cls.__qualname__}"
    entry_id = getattr(entry, "id", None)
    return f"{kind} {entry_id!r} ({where})" if isinstance(entry_id, str) and entry_id.strip() else f"{kind} {where}"


def _check_entry(entry: Any, kind: str, required: tuple[str, ...]) -> None:
    for attr in required:
        value = getattr(entry, attr, None)
        if value is None:
            raise RegistryError(f"{_named(entry, kind)} is missing the required attribute `{attr}`")
        if attr in ("id", "module"):
            if not isinstance(value, str) or not value.strip():
                raise RegistryError(f"{_named(entry, kind)}: `{attr}` must be a non-empty string, got {value!r}")
        elif not callable(value):
            raise RegistryError(f"{_named(entry, kind)}: `{attr}` must be callable, got {value!r:.100}")
    if "#" in entry.id:
        raise RegistryError(f"{kind} id {entry.id!r} may not contain '#'")
    for name in ("budget_ms", "max_concurrency"):
        value = getattr(entry, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise RegistryError(f"{kind} {entry.id!r}: {name} must be a positive whole number")
    rate = getattr(entry, "max_rate", None)
    if rate is not None and (
        isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) or rate <= 0
    ):
        raise RegistryError(f"{kind} {entry.id!r}: max_rate must be a positive number of calls a second")
    burst = getattr(entry, "max_burst", None)
    if burst is not None and (isinstance(burst, bool) or not isinstance(burst, int) or burst < 1):
        raise RegistryError(f"{kind} {entry.id!r}: max_burst must be a positive whole number")
    if burst is not None and rate is None:
        raise RegistryError(f"{kind} {entry.id!r}: max_burst needs a max_rate")
    value_type = getattr(entry, "value_type", None)
    if value_type is not None and not callable(value_type):
        raise RegistryError(f"{kind} {entry.id!r}: value_type must be int, float, str or a callable")


def _fill_optional(entry: Any, optional: tuple[str, ...]) -> None:
    """Set each optional attribute the entry lacks to ``None``: unset, as on an `Action`.

    An entry that takes no attribute (``__slots__``, a frozen dataclass) is left as it is: the
    engine reads every optional attribute with a default as well."""
    for name in optional:
        if not hasattr(entry, name):
            try:
                setattr(entry, name, None)
            except (AttributeError, TypeError):
                logger.debug("%s keeps no attribute %s: read as unset", _named(entry, "entry"), name)


def _register(
    table: dict[str, Any], entry: Any, kind: str, required: tuple[str, ...], optional: tuple[str, ...]
) -> Any:
    _check_entry(entry, kind, required)
    current = table.get(entry.id)
    if current is not None and current is not entry:
        raise RegistryError(f"{kind} {entry.id!r} is already registered by module {current.module!r}")
    _fill_optional(entry, optional)
    table[entry.id] = entry
    return entry


def register_action(action: ActionT) -> ActionT:
    """Register an action (an `Action`, or any object with the same attributes); answers it.

    Refuses (`RegistryError`, naming the attribute and the action) one without a non-empty
    ``id`` or ``module`` or a callable ``perform`` (`ACTION_REQUIRED`); each optional
    attribute it lacks (`ACTION_OPTIONAL`) is set to ``None``, unset."""
    return cast(ActionT, _register(_actions, action, "action", ACTION_REQUIRED, ACTION_OPTIONAL))


def register_lease(lease: LeaseT) -> LeaseT:
    """Register a lease (a `Lease`, or any object with the same attributes); answers it.

    Refuses (`RegistryError`, naming the attribute and the lease) one without a non-empty
    ``id`` or ``module`` or a callable ``read``, ``apply`` or ``restore`` (`LEASE_REQUIRED`);
    each optional attribute it lacks (`LEASE_OPTIONAL`) is set to ``None``, unset."""
    return cast(LeaseT, _register(_leases, lease, "lease", LEASE_REQUIRED, LEASE_OPTIONAL))


def unregister_module(name: str) -> None:
    """Remove every action and lease of one module, as when it is uninstalled."""
    for table in (_actions, _leases):
        for key in [k for k, v in table.items() if v.module == name]:
            del table[key]


def get_action(action_id: str) -> Action | None:
    return _actions.get(action_id)


def get_lease(lease_id: str) -> Lease | None:
    return _leases.get(lease_id)


def lease_ref(lease_id: str, target: str) -> str:
    return f"{lease_id}#{target}"


def lease_for_ref(ref: object) -> tuple[Lease | None, str]:
    """The lease and target a ledger ref names, as ``(lease or None, target)``."""
    lease_id, _, target = str(ref).partition("#")
    return _leases.get(lease_id), target


def actions() -> dict[str, Action]:
    return dict(_actions)


def leases() -> dict[str, Lease]:
    return dict(_leases)


def modules() -> list[str]:
    """The names of every registered module."""
    entries: tuple[Action | Lease, ...] = (*_actions.values(), *_leases.values())
    return sorted({cast(str, e.module) for e in entries})


# Sent by `backend_restarted`; the engine (`cleanup.outages.restart_reported`, connected when
# the app is ready) records the reconcile the backend owes.
restart_reported = Signal()


def backend_restarted(name: str, backend: str = "") -> None:
    """Tell the engine that one backend of a module restarted (it saw a new boot id).

    Records in the database that the backend owes a reconcile of its rows alone that also
    looks at what was given back recently (``EVENT_RECONCILE_LOOKBACK_S``): a backend that
    rolled back to its last save may have brought some of it back. The tick pays the debt
    (a queued task hurries it), so the restart is not forgotten if that task is lost.
    ``backend`` is ``""`` for a module with one.
    """
    if backend:
        logger.info("module %s reports that its backend %s restarted", name, backend)
    else:
        logger.info("module %s reports that its backend restarted", name)
    if not restart_reported.has_listeners():
        # Only when the app is not loaded: the reconcile is queued, with no debt behind it.
        queue_reconcile(module=name, restarted=True, backend=backend)
        return
    restart_reported.send(sender=name, module=name, backend=backend)


# The alphabet of `short_key`: lower-case letters and the digits 2 to 7 (RFC 4648 base32).
SHORT_KEY_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"


def short_key(idempotency_key: str, length: int = 12) -> str:
    """A short, stable form of an idempotency key, for an engine that can carry only a few
    characters (a bot's name, a tag): ``length`` characters (4 to 52) of `SHORT_KEY_ALPHABET`.

    The same key always gives the same form, in every process and release; two keys give the
    same form of 12 characters (60 bits) about once in a billion billion pairs, of 8 (40 bits)
    once in a million million. An idempotency key itself is 32 characters of ``0-9a-f`` (a
    random UUID in hex) and never longer than 64 characters of ASCII letters, digits and
    ``-``: use it whole wherever the backend can store it.
    """
    if not isinstance(length, int) or isinstance(length, bool) or not 4 <= length <= 52:
        raise ValueError(f"length must be a whole number from 4 to 52, not {length!r}")
    digest = hashlib.sha256(str(idempotency_key).encode("utf-8", "surrogatepass")).digest()
    return base64.b32encode(digest).decode("ascii").lower()[:length]


def parse_value(lease: object, value: Any) -> Any:
    """``value`` as the lease's ``value_type`` reads it (unchanged without one, or when it
    cannot be read that way): how the engine compares a value read back with one applied."""
    value_type = getattr(lease, "value_type", None)
    if value_type is None or value is None:
        return value
    try:
        return value_type(value)
    except Exception:  # a module's parser is untrusted too: unparsed, the value is compared as it is
        return value


def same_value(lease: object, first: Any, second: Any) -> bool:
    """Whether two values of a lease are the same once read by its ``value_type``."""
    try:
        return bool(parse_value(lease, first) == parse_value(lease, second))
    except Exception:
        return False
