"""`registry.never_raises` and `registry.terminal`: a module's callables answer, never raise.

Both example modules use these two helpers of the public registry (docs/modules.md, *The
envelope*); the engine reads their answers through `cleanup.calls` like any other.
"""

import inspect
import logging

import pytest

from cleanup import calls, registry
from eventsite.luanti import module as luanti_module
from eventsite.sandbox import module as sandbox_module


class Boom(registry.Action):
    id = "helpers.boom"
    module = "helpers"

    def __init__(self, fail_with=None):
        self.fail_with = fail_with
        self.backends = []

    @registry.never_raises
    def perform(self, *, run_id, step_id, params, idempotency_key):
        if self.fail_with is not None:
            raise self.fail_with
        return {"ok": True, "resources": [{"kind": "thing", "ref": idempotency_key}]}

    @registry.never_raises
    def revert(self, *, run_id, resources, idempotency_key, backend=""):
        self.backends.append(backend)
        if self.fail_with is not None:
            raise self.fail_with
        return {"ok": True, "failed": []}


def test_an_exception_becomes_a_failure_to_retry_naming_the_call_and_the_exception(caplog):
    action = Boom(fail_with=KeyError("creature"))

    with caplog.at_level(logging.ERROR, logger=__name__):
        answer = action.perform(run_id=1, step_id=2, params={}, idempotency_key="k")

    assert answer == {
        "ok": False,
        "error": "helpers.boom perform failed: KeyError: 'creature'",
        "retry": True,
    }
    # Logged with its traceback, on the logger of the module that defines the callable.
    [record] = [r for r in caplog.records if r.name == __name__]
    assert record.getMessage() == "helpers.boom perform failed"
    assert record.exc_info is not None and record.exc_info[0] is KeyError


def test_an_answer_passes_through_unchanged():
    assert Boom().perform(run_id=1, step_id=2, params={}, idempotency_key="k") == {
        "ok": True,
        "resources": [{"kind": "thing", "ref": "k"}],
    }


def test_a_callable_that_is_not_a_method_of_an_entry_is_named_by_its_own_name():
    @registry.never_raises
    def health(*, backend=""):
        raise RuntimeError("no answer")

    answer = health(backend="north")

    assert answer["retry"] is True
    assert answer["error"].endswith("health failed: RuntimeError: no answer")


def test_the_wrapper_keeps_the_signature_so_the_engine_still_passes_the_backend():
    action = Boom()

    assert list(inspect.signature(action.revert).parameters) == ["run_id", "resources", "idempotency_key", "backend"]
    answer = calls.call(
        action.revert,
        budget_ms=5_000,
        what="helpers.boom revert",
        backend="north",
        run_id=1,
        resources=[],
        idempotency_key="k",
    )

    assert action.backends == ["north"]
    assert calls.classify_revert(answer, "helpers.boom revert").outcome == calls.Outcome.DONE


def test_the_engine_reads_a_raised_exception_as_a_retry_with_the_modules_sentence():
    action = Boom(fail_with=ValueError("the shard is on fire"))

    answer = calls.call(
        action.revert,
        budget_ms=5_000,
        what="helpers.boom revert",
        backend="",
        run_id=1,
        resources=[],
        idempotency_key="k",
    )
    verdict = calls.classify_revert(answer, "helpers.boom revert")

    assert answer.exception is None  # the module answered; nothing reached the engine raised
    assert verdict.outcome == calls.Outcome.RETRY
    assert "helpers.boom revert failed: ValueError: the shard is on fire" in verdict.error


def test_terminal_is_a_failure_only_a_person_can_help_with():
    answer = registry.terminal("no spawner is named 'bat-cave'")

    assert answer == {"ok": False, "error": "no spawner is named 'bat-cave'", "retry": False}
    verdict = calls.classify_revert(calls.Answer(raw=answer), "sandbox.spawner_rate restore")
    assert verdict.outcome == calls.Outcome.TERMINAL
    assert "no spawner is named 'bat-cave'" in verdict.error


@pytest.mark.parametrize("example", [sandbox_module, luanti_module], ids=["sandbox", "luanti"])
def test_the_example_modules_use_the_registrys_helpers_and_keep_no_copy(example):
    assert example.never_raises is registry.never_raises
    assert example.terminal is registry.terminal
    source = inspect.getsource(example)
    assert "def never_raises" not in source
    assert "def terminal" not in source


def test_the_luanti_module_answers_a_bad_param_as_terminal_and_a_crash_as_a_retry(monkeypatch):
    spawn = luanti_module.SPAWN
    params = {"entity": "wolf", "count": 3, "at": [0, 10, 0]}

    refused = spawn.perform(run_id=1, step_id=1, params={**params, "count": 0}, idempotency_key="k")
    assert refused["retry"] is False and "count" in refused["error"]

    def world_gone(backend):
        raise RuntimeError("the world's directory is gone")

    monkeypatch.setattr(luanti_module.worlds, "world", world_gone)
    crashed = spawn.perform(run_id=1, step_id=1, params=params, idempotency_key="k", backend="north")
    assert crashed == {
        "ok": False,
        "error": "luanti.spawn perform failed: RuntimeError: the world's directory is gone",
        "retry": True,
    }
    assert calls.backend_kwargs(spawn.perform, "north") == {"backend": "north"}


def test_the_sandbox_module_answers_a_crash_of_its_client_as_a_retry(monkeypatch):
    def broken(backend):
        raise RuntimeError("no client")

    monkeypatch.setattr(sandbox_module.fleet, "client", broken)
    answer = sandbox_module.SPAWN.revert(run_id=1, resources=[], idempotency_key="k", backend="")

    assert answer == {"ok": False, "error": "sandbox.spawn revert failed: RuntimeError: no client", "retry": True}
    assert calls.backend_kwargs(sandbox_module.SPAWN.revert, "") == {"backend": ""}
