"""The envelopes: the shapes of what a module answers and receives, as types.

Every callable of a module (see `cleanup.registry`) answers a dict, the envelope. These
``TypedDict`` s spell its shapes for a module author's type checker, and for a reader::

    from cleanup.envelopes import PerformAnswer

    def perform(self, *, run_id, step_id, params, idempotency_key) -> PerformAnswer:
        return {"ok": True, "resources": [{"kind": "creature", "ref": "cr-1"}]}

They are types only: the engine still trusts no answer at run time. Whatever a module
answers, of these shapes or not, goes through the one classifier in `cleanup.calls`,
where only a dict whose ``ok`` is exactly ``True`` (with the rest in the promised shape)
is a success, and every other answer, exception or late call is a failure.

This module imports nothing of the engine, so a module may import it anywhere.
"""

from typing import Any, Literal, NotRequired, TypeAlias, TypedDict

__all__ = [
    "ApplyAnswer",
    "Drifted",
    "Failure",
    "HealthAnswer",
    "HealthOk",
    "KeepaliveAnswer",
    "KeepaliveOk",
    "Lapse",
    "Ok",
    "PerformAnswer",
    "PerformOk",
    "ReadAnswer",
    "ReadOk",
    "ReconcileAnswer",
    "ReconcileOk",
    "RecordedResource",
    "ResourceEntry",
    "RestoreAnswer",
    "RevertAnswer",
    "RevertOk",
]


# -- what a module receives ------------------------------------------------------------


class ResourceEntry(TypedDict):
    """One thing a ``perform`` made in the world, as it reports it.

    ``kind`` and ``ref`` are non-empty strings (the kinds ``step`` and ``override`` are
    the engine's own); ``payload`` (a dict) and ``member_key`` (a string, the group a row
    is given back with) are optional.
    """

    kind: str
    ref: str
    payload: NotRequired[dict[str, Any]]
    member_key: NotRequired[str]
    # Which of the module's backends holds it, when not the step's own.
    backend: NotRequired[str]


class RecordedResource(TypedDict):
    """A ledger row as ``revert`` and ``reconcile`` receive it: all four keys, always.

    ``payload`` and ``member_key`` are what ``perform`` answered (``{}`` and ``""`` when it
    gave none).
    """

    kind: str
    ref: str
    payload: dict[str, Any]
    member_key: str


# -- what a module answers ---------------------------------------------------------------


class Ok(TypedDict):
    """Success with nothing more to say: ``apply``, ``restore`` and ``health``."""

    ok: Literal[True]


class PerformOk(TypedDict):
    """``perform`` did the step: one entry per thing it created."""

    ok: Literal[True]
    resources: list[ResourceEntry]


class RevertOk(TypedDict):
    """``revert`` gave back every ref of the list except those in ``failed``.

    ``failed`` names only refs of the list it was handed, as a list or as an object
    ``{ref: reason}`` that says why each was not given back (each row then shows its own
    reason); a thing already gone counts as given back.
    """

    ok: Literal[True]
    failed: list[str] | dict[str, str]


class ReconcileOk(TypedDict):
    """``reconcile``: the refs of the list still in the world, and those it cannot tell
    about (``unknown``: left as they are); the rest are gone."""

    ok: Literal[True]
    in_force: list[str]
    unknown: NotRequired[list[str]]


class HealthOk(TypedDict):
    """``health``: the backend answers; ``boot_id`` names its current boot, so that a
    restart nobody reported is seen (a different one than last time)."""

    ok: Literal[True]
    boot_id: NotRequired[str]


class Lapse(TypedDict):
    """What a backend's dead-man's switch did when the core's session lapsed.

    ``given_back``: the ledger refs it gave back by itself (creatures removed, leases put
    back to their baseline). ``kept``: refs it could not give back, each with why. ``at``:
    when it went off (ISO 8601), ``silent_s``: how long it had heard nothing; either may be
    None when the backend cannot tell.
    """

    at: str | None
    silent_s: float | None
    given_back: list[str]
    kept: dict[str, str]


class KeepaliveOk(TypedDict):
    """``keepalive``: the session is renewed, or, with ``lapsed``, it had lapsed before
    this call (the engine then starts a new session)."""

    ok: Literal[True]
    lapsed: NotRequired[Lapse]


class ReadOk(TypedDict):
    """``read``: the value in force now."""

    ok: Literal[True]
    value: Any


class Drifted(TypedDict):
    """Somebody else's value is in place (``restore``, ``revert``): left alone for a person.

    ``current`` is that value, shown to staff; nothing is retried automatically.
    """

    ok: Literal[False]
    drifted: Literal[True]
    current: Any


class Failure(TypedDict):
    """Any call that did not do its work.

    ``error``: a sentence a person can act on. ``retry``: ``True`` (or left out) when it is
    worth another try after a backoff, ``False`` when only a person can help.
    ``unavailable``: ``True`` when the backend itself is down: the answer then blames the
    backend, not the row, and counts toward marking the module down (`cleanup.outages`),
    which gives the rows' attempts back.
    """

    ok: Literal[False]
    error: str
    retry: NotRequired[bool]
    unavailable: NotRequired[bool]


PerformAnswer: TypeAlias = PerformOk | Failure
RevertAnswer: TypeAlias = RevertOk | Drifted | Failure
ReconcileAnswer: TypeAlias = ReconcileOk | Failure
ReadAnswer: TypeAlias = ReadOk | Failure
ApplyAnswer: TypeAlias = Ok | Failure
RestoreAnswer: TypeAlias = Ok | Drifted | Failure
HealthAnswer: TypeAlias = HealthOk | Failure
KeepaliveAnswer: TypeAlias = KeepaliveOk | Failure
