"""System checks for the engine's settings and django-q2's configuration."""

from django.conf import settings
from django.core import checks

from .conf import BOUNDS


@checks.register(checks.Tags.compatibility)
def check_engine_settings(app_configs=None, **kwargs):
    errors = []
    for name, (_default, low, high) in BOUNDS.items():
        if not hasattr(settings, name):
            continue
        value = getattr(settings, name)
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(
                checks.Error(
                    f"{name}={value!r} is not a whole number.",
                    hint=f"Set {name} to a whole number from {low} to {high}.",
                    id="cleanup.E001",
                )
            )
        elif not low <= value <= high:
            errors.append(
                checks.Error(
                    f"{name}={value!r} is outside {low}..{high}.",
                    hint=f"Set {name} to a whole number from {low} to {high}.",
                    id="cleanup.E002",
                )
            )
    if not errors:
        budget_s = getattr(settings, "EVENT_DEFAULT_BUDGET_MS", BOUNDS["EVENT_DEFAULT_BUDGET_MS"][0])
        claim_s = getattr(settings, "EVENT_CLAIM_TIMEOUT_S", BOUNDS["EVENT_CLAIM_TIMEOUT_S"][0])
        if claim_s * 1000 <= budget_s:
            errors.append(
                checks.Error(
                    f"EVENT_CLAIM_TIMEOUT_S={claim_s!r} is not longer than EVENT_DEFAULT_BUDGET_MS={budget_s!r} ms.",
                    hint="A claim must outlive the module call it covers, or a second "
                    "sweeper takes the row while the first is still waiting for its answer.",
                    id="cleanup.E003",
                )
            )
    return errors


@checks.register(checks.Tags.compatibility)
def check_q_cluster(app_configs=None, **kwargs):
    conf = getattr(settings, "Q_CLUSTER", None)
    if not isinstance(conf, dict):
        return [checks.Error("Q_CLUSTER is not set.", id="cleanup.E010")]
    errors = []
    timeout, retry = conf.get("timeout"), conf.get("retry", 60)
    if not isinstance(timeout, int) or not isinstance(retry, int) or timeout >= retry:
        errors.append(
            checks.Error(
                f"Q_CLUSTER timeout={timeout!r} must be a whole number below retry={retry!r}.",
                hint="django-q2 hands a task out again after `retry` seconds; a task that "
                "may still be running then is run twice.",
                id="cleanup.E011",
            )
        )
    tick_s = getattr(settings, "EVENT_TICK_BUDGET_S", 300)
    call_s = getattr(settings, "EVENT_DEFAULT_BUDGET_MS", 10_000) / 1000
    if isinstance(timeout, int) and isinstance(tick_s, int) and tick_s + call_s >= timeout:
        errors.append(
            checks.Error(
                f"EVENT_TICK_BUDGET_S={tick_s!r} plus one module call ({call_s:g} s) is not below "
                f"Q_CLUSTER timeout={timeout!r}.",
                hint="A tick stops starting work after its budget, but the call it is in may "
                "still take its own budget; both must end before django-q2 kills the task.",
                id="cleanup.E014",
            )
        )
    if not conf.get("ack_failures"):
        errors.append(
            checks.Error(
                "Q_CLUSTER ack_failures is off: a failing task is handed out again for ever.",
                id="cleanup.E012",
            )
        )
    attempts = conf.get("max_attempts", 0)
    if not isinstance(attempts, int) or attempts < 1:
        errors.append(
            checks.Error(
                f"Q_CLUSTER max_attempts={attempts!r} must be at least 1 (0 means for ever).",
                id="cleanup.E013",
            )
        )
    return errors
