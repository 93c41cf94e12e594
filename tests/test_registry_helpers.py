"""The public registry's helpers for a module's callables: `never_raises`, `terminal`,
`retry`, `refs_of`, `chunks` and `lapsed`.

The example modules use them (docs/modules.md, *The envelope*) and keep no copy of their
own; the engine reads their answers through `cleanup.calls` like any other.
"""

import inspect
import logging
import re

import pytest

from cleanup import calls, registry
from eventsite.arena import module as arena_module
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


@pytest.mark.parametrize("example", [sandbox_module, luanti_module, arena_module], ids=["sandbox", "luanti", "arena"])
def test_the_example_modules_use_the_registrys_helpers_and_keep_no_copy(example):
    assert example.never_raises is registry.never_raises
    assert example.terminal is registry.terminal
    source = inspect.getsource(example)
    for helper in ("never_raises", "terminal", "retry", "refs_of", "chunks", "lapsed"):
        assert f"def {helper}(" not in source and f"def _{helper}(" not in source
    assert "fromtimestamp" not in source  # a lapse is spelled by `registry.lapsed`


def test_retry_is_a_failure_to_try_again_and_unavailable_blames_the_backend():
    answer = registry.retry("the shard answered a spawn in a shape it should not")
    down = registry.retry("the server did not answer", unavailable=True)

    assert answer == {"ok": False, "error": "the shard answered a spawn in a shape it should not", "retry": True}
    assert down == {"ok": False, "error": "the server did not answer", "retry": True, "unavailable": True}
    assert calls.classify_revert(calls.Answer(raw=answer), "x revert").outcome == calls.Outcome.RETRY


def test_refs_of_answers_each_ref_once_in_order():
    resources = [{"kind": "bot", "ref": "b"}, {"kind": "bot", "ref": "a", "payload": {}}, {"ref": "b"}]

    assert registry.refs_of(resources) == ["b", "a"]
    assert registry.refs_of([]) == []


@pytest.mark.parametrize(
    ("resources", "named"),
    [
        ("cr-1", "resources must be a list, not str"),
        ([{"kind": "bot"}], "a resource without a ref: {'kind': 'bot'}"),
        ([{"ref": "  "}], "a resource without a ref"),
        (["cr-1"], "a resource without a ref: 'cr-1'"),
    ],
)
def test_refs_of_refuses_a_list_it_cannot_read_naming_what_is_wrong(resources, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        registry.refs_of(resources)


def test_chunks_splits_in_order_into_lists_of_at_most_size():
    assert registry.chunks(["a", "b", "c", "d", "e"], 2) == [["a", "b"], ["c", "d"], ["e"]]
    assert registry.chunks(("a", "b"), 5) == [["a", "b"]]
    assert registry.chunks([], 3) == []


@pytest.mark.parametrize("size", [0, -1, True, 1.5, "2"])
def test_chunks_refuses_a_size_that_is_not_a_positive_whole_number(size):
    with pytest.raises(ValueError, match="size must be a positive whole number"):
        registry.chunks(["a"], size)


def test_lapsed_spells_a_keepalives_answer_with_the_time_in_iso_8601():
    answer = registry.lapsed(given_back=["cr-1"], kept={"cr-2": "in combat"}, at=1_700_000_000, silent_s=12)

    assert answer == {
        "ok": True,
        "lapsed": {
            "at": "2023-11-14T22:13:20+00:00",
            "silent_s": 12.0,
            "given_back": ["cr-1"],
            "kept": {"cr-2": "in combat"},
        },
    }


def test_lapsed_answers_none_for_a_time_the_backend_could_not_tell():
    answer = registry.lapsed(given_back=[], kept={}, at="yesterday", silent_s=None)

    assert answer["lapsed"]["at"] is None and answer["lapsed"]["silent_s"] is None


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


@pytest.mark.django_db
def test_a_restart_is_logged_naming_the_backend_and_never_an_empty_name(caplog):
    with caplog.at_level(logging.INFO, logger="cleanup.registry"):
        registry.backend_restarted("test")
        registry.backend_restarted("test", backend="north")
    said = [r.getMessage() for r in caplog.records if r.name == "cleanup.registry"]
    assert said == [
        "module test reports that its backend restarted",
        "module test reports that its backend north restarted",
    ]
