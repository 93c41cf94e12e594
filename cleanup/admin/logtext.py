"""A run log entry in words: a sentence, then its details as labelled values.

The log's detail is JSON whose keys depend on the entry's kind (`cleanup.models.LogKind`);
a person reads "Given back: sandbox.spawn.revert, 6 resources." and, under it, each value
with its label ("by: alice", "resources: creature:orc-1, creature:orc-2"), never a Python
dict. A key the sentence does not know is still listed, so nothing the engine wrote is
hidden.

May import nothing of the engine (a pure function of an entry's kind and detail); the
admin's run pages import it.
"""

from typing import Any

from django.utils.text import capfirst

LABELS = {
    "by": "by",
    "actor": "by",
    "what": "call",
    "outcome": "outcome",
    "error": "error",
    "reason": "reason",
    "resources": "resources",
    "failed": "failed",
    "reasons": "why each failed",
    "current": "value found",
    "reset": "rows reset",
    "step": "step",
    "position": "position",
    "steps": "steps",
    "attempt": "attempt",
    "waited_s": "waited (s)",
    "seconds": "seconds",
    "until": "until",
    "module": "module",
    "action": "action",
    "backend": "backend",
    "attempted": "groups tried",
    "reverted": "given back",
    "drifted": "drifted",
    "remaining": "left",
    "cleanup": "give back",
    "baseline_to": "baseline handed to row",
}
LIST_ITEMS = 8
TEXT_CHARS = 300


def text_of(value: object) -> str:
    """A detail value as text: lists joined, mappings as "key: value", long text shortened."""
    if isinstance(value, list | tuple):
        shown = ", ".join(text_of(v) for v in value[:LIST_ITEMS])
        return shown + (f" and {len(value) - LIST_ITEMS} more" if len(value) > LIST_ITEMS else "")
    if isinstance(value, dict):
        return "; ".join(f"{k}: {text_of(v)}" for k, v in list(value.items())[:LIST_ITEMS])
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "-"
    text = str(value)
    return text if len(text) <= TEXT_CHARS else text[: TEXT_CHARS - 1] + "…"


def _count(detail: dict[str, Any], key: str) -> int | None:
    """How many: a list's length, or a number the entry gives."""
    value = detail.get(key)
    if isinstance(value, list):
        return len(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _step(detail: dict[str, Any]) -> str:
    position = detail.get("step", detail.get("position"))
    action = detail.get("action")
    where = f"step {position + 1}" if isinstance(position, int) and not isinstance(position, bool) else "a step"
    return f"{where} ({action})" if action else where


def sentence(kind: str, detail: object) -> str:
    """What happened, in one sentence."""
    detail = detail if isinstance(detail, dict) else {}
    by = detail.get("by") or detail.get("actor")
    by_text = f" by {by}" if by else ""
    what = detail.get("what")
    n = _count(detail, "resources")
    rows = f", {n} resource{'s' if n != 1 else ''}" if n is not None else ""
    error = detail.get("error")
    because = f": {text_of(error)}" if error else ""
    if kind == "run.started":
        return f"The run started{by_text}."
    if kind == "run.completed":
        return "The run completed: every step is done."
    if kind == "run.cancelled":
        leave = detail.get("cleanup") is False
        return f"The run was cancelled{by_text}" + (", leaving what it took for later." if leave else ".")
    if kind == "run.aborted":
        return f"The run was aborted{because}."
    if kind == "step.performed":
        return f"{capfirst(_step(detail))} was performed{rows}."
    if kind == "step.failed":
        return f"{capfirst(_step(detail))} failed{because}."
    if kind == "step.waiting":
        reason = detail.get("reason") or error
        if reason:
            return f"{capfirst(_step(detail))} waits: {text_of(reason)}."
        seconds = detail.get("seconds")
        return f"{capfirst(_step(detail))} waits" + (f" {text_of(seconds)} s." if seconds is not None else ".")
    if kind == "cleanup.retry":
        reset = f": {n} row{'s' if n != 1 else ''} back under the attempt ceiling" if n is not None else ""
        return f"A person asked for the cleanup again{by_text}{reset}."
    if kind == "cleanup.swept":
        counts = {k: detail.get(k, 0) for k in ("reverted", "failed", "drifted", "remaining")}
        return (
            f"A cleanup pass{by_text}: {counts['reverted']} given back, {counts['failed']} failed, "
            f"{counts['drifted']} drifted, {counts['remaining']} left."
        )
    if kind == "cleanup.reverted":
        return f"Given back{f' through {what}' if what else ''}{rows}."
    if kind == "cleanup.failed":
        return f"Could not give back{f' through {what}' if what else ''}{rows}{because}."
    if kind == "cleanup.gave_up":
        return "The cleanup gave up: what is left waits for a person."
    if kind == "cleanup.completed":
        of = f" ({n} ledger row{'s' if n != 1 else ''})" if n is not None else ""
        return f"The cleanup completed: nothing the run took is left unresolved{of}."
    if kind == "cleanup.recovered":
        return "The cleanup completed after it had given up."
    if kind == "resource.orphaned":
        return f"Gone from the world before it was given back{rows}."
    if kind == "resource.waived":
        reason = detail.get("reason")
        return f"Waived{by_text}{rows}" + (f": {text_of(reason)}." if reason else ".")
    if kind == "resource.resurrected":
        return f"Back in the world after its backend restarted{rows}; it will be given back again."
    return f"{kind}."


def details(detail: object) -> list[tuple[str, str]]:
    """Every value of the detail, labelled: ``[("by", "alice"), ("resources", "creature:orc-1")]``."""
    if not isinstance(detail, dict):
        return [("detail", text_of(detail))] if detail not in (None, "", {}) else []
    return [(LABELS.get(key, key.replace("_", " ")), text_of(value)) for key, value in detail.items()]
