"""``GET /metrics``: what staff see in the admin, in Prometheus's text format, for whoever may scrape."""

import os
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from cleanup import counters, outages, registry
from cleanup.models import Counter, ModuleHealth, Resource, Run
from cleanup.sweep import sweep
from tests.databases import server_url
from tests.fakes import FakeAction, Scripted, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent


def scrape(client, **headers):
    answer = client.get("/metrics", **headers)
    assert answer.status_code == 200, answer.content
    assert answer["Content-Type"].startswith("text/plain; version=")
    return {f.name: f for f in text_string_to_metric_families(answer.content.decode())}


def samples(family, name=None):
    return {tuple(sorted(s.labels.items())): s.value for s in family.samples if name is None or s.name == name}


def a_night(settings):
    """A run whose rows failed for good, another whose row is live on a backend that is down."""
    settings.EVENT_REVERT_MAX_ATTEMPTS = 1
    settings.EVENT_REVERT_BACKOFF_S = 0
    registry.register_action(FakeAction(revert=Scripted({"ok": False, "error": "shard says no", "retry": False})))
    failed = make_run(name="invasion")
    make_rows(make_step(failed), ["troll-1", "troll-2"], placeholder=False)
    sweep()
    waiting = make_run(name="festival")
    make_rows(make_step(waiting, action_id="test.spawn"), ["wolf-1"], placeholder=False)
    Resource.objects.filter(run=waiting).update(module="other", backend="north")
    outages.mark_down("other", reason="maintenance", by="alice", backend="north")
    return failed, waiting


def test_the_names_and_labels_after_a_night_with_a_down_backend_and_a_failed_row(client, settings):
    failed, waiting = a_night(settings)
    families = scrape(client)

    rows = samples(families["eventsite_ledger_rows"])
    assert rows[(("backend", ""), ("module", "test"), ("state", "failed"))] == 2
    assert rows[(("backend", "north"), ("module", "other"), ("state", "live"))] == 1
    assert samples(families["eventsite_rows_waiting_for_person"]) == {(): 2}
    assert samples(families["eventsite_oldest_unresolved_seconds"])[()] >= 0
    runs = samples(families["eventsite_runs"])
    assert runs[(("cleanup_status", "incomplete"), ("status", "completed"))] == 1
    assert sum(runs.values()) == Run.objects.count() == 2
    up = samples(families["eventsite_backend_up"])
    assert up[(("backend", "north"), ("module", "other"))] == 0
    assert up[(("backend", ""), ("module", "test"))] == 1
    assert samples(families["eventsite_alerts_pending"]) == {(): 0}

    calls = samples(families["eventsite_module_calls"], "eventsite_module_calls_total")
    assert calls == {(("backend", ""), ("module", "test"), ("outcome", "ok"), ("verb", "revert")): 1}
    latency = families["eventsite_module_call_seconds"]
    labels = (("backend", ""), ("module", "test"), ("verb", "revert"))
    assert samples(latency, "eventsite_module_call_seconds_count") == {labels: 1}
    inf = [s for s in latency.samples if s.name.endswith("_bucket") and s.labels["le"] == "+Inf"]
    assert [s.value for s in inf] == [1]
    assert samples(families["eventsite_sweep_passes"], "eventsite_sweep_passes_total")[()] >= 1
    assert samples(families["eventsite_sweep_rows"], "eventsite_sweep_rows_total") == {(("verdict", "failed"),): 2}


def test_the_reconciles_owed_after_restarts_are_counted_with_the_age_of_the_oldest(client):
    families = scrape(client)
    assert samples(families["eventsite_reconciles_owed"]) == {(): 0}
    assert samples(families["eventsite_oldest_owed_reconcile_seconds"]) == {(): 0}

    start = timezone.now()
    with time_machine.travel(start - timedelta(minutes=20), tick=False):
        outages.owe_reconcile("sandbox", "north")
    outages.owe_reconcile("sandbox", "south")
    outages.owe_reconcile("sandbox", "north")  # a second restart keeps the oldest debt's time
    with time_machine.travel(start, tick=False):
        families = scrape(client)
    assert samples(families["eventsite_reconciles_owed"]) == {(): 2}
    assert samples(families["eventsite_oldest_owed_reconcile_seconds"]) == {(): 20 * 60}

    health = ModuleHealth.objects.get(module="sandbox", backend="north")
    outages.clear_owed(health, uuid.uuid4())  # its reconcile finished
    families = scrape(client)
    assert samples(families["eventsite_reconciles_owed"]) == {(): 1}
    assert 0 < samples(families["eventsite_oldest_owed_reconcile_seconds"])[()] < 20 * 60


def test_a_call_that_raises_or_runs_out_of_budget_is_counted_so(client, settings):
    import time

    def boom(**kwargs):
        raise RuntimeError("socket closed")

    def slow(**kwargs):
        time.sleep(0.5)
        return {"ok": True, "failed": []}

    settings.EVENT_REVERT_BACKOFF_S = 0
    registry.register_action(FakeAction(id="test.boom", revert=boom))
    registry.register_action(FakeAction(id="test.slow", revert=slow, budget_ms=50))
    make_rows(make_step(make_run(), action_id="test.boom"), ["a"], placeholder=False)
    make_rows(make_step(make_run(), action_id="test.slow"), ["b"], placeholder=False)
    sweep()
    time.sleep(0.6)  # the slow call ends late: it was counted once, as a timeout
    families = scrape(client)
    outcomes = {
        dict(labels)["outcome"]: value
        for labels, value in samples(families["eventsite_module_calls"], "eventsite_module_calls_total").items()
    }
    assert outcomes == {"error": 1, "timeout": 1}


def test_a_scrape_answers_only_loopback_or_the_token(client, settings):
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200
    settings.EVENT_METRICS_TOKEN = "s3cret-token"
    assert client.get("/metrics").status_code == 403  # loopback no longer enough
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert client.post("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token").status_code == 405


def test_a_scrapes_queries_do_not_grow_with_the_ledger(client, settings):
    a_night(settings)
    counters.flush()  # what the night counted; a scrape writes it first, once
    with CaptureQueriesContext(connection) as few:
        scrape(client)
    for i in range(20):
        run = make_run(name=f"night {i}")
        make_rows(make_step(run), [f"orc-{i}-{j}" for j in range(10)])
        ModuleHealth.objects.get_or_create(module=f"module-{i}", backend="b")
    counters.flush()
    with CaptureQueriesContext(connection) as many:
        scrape(client)
    assert len(many.captured_queries) == len(few.captured_queries) <= 12
    assert Run.objects.count() > 20


def test_counters_add_up_across_flushes_and_are_not_lost_when_the_write_fails(monkeypatch):
    counters.add("sweep_passes_total")
    counters.add("sweep_passes_total")
    counters.flush()
    counters.add("sweep_passes_total", amount=3)
    from django.db import DatabaseError

    class Broken:
        def __enter__(self):
            raise DatabaseError("gone")

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(connection, "cursor", lambda: Broken())
    assert counters.flush() == 0
    monkeypatch.undo()
    counters.flush()
    assert Counter.objects.get(name="sweep_passes_total").value == 5


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_what_another_process_counted_is_in_this_processs_scrape(client, settings):
    counters.add("sweep_passes_total", amount=2)
    counters.flush()
    name = connection.settings_dict["NAME"]
    code = (
        "from cleanup import counters\n"
        "counters.add('sweep_passes_total', amount=5)\n"
        "counters.add('sweep_rows_total', {'verdict': 'reverted'}, 7)\n"
    )  # written when the process exits
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "eventsite.settings",
        "DEBUG": "1",
        "DATABASE_URL": server_url(name),
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    families = scrape(client)
    assert samples(families["eventsite_sweep_passes"], "eventsite_sweep_passes_total")[()] >= 7
    assert samples(families["eventsite_sweep_rows"], "eventsite_sweep_rows_total") == {(("verdict", "reverted"),): 7}


def test_the_namespace_is_a_setting(client, settings):
    settings.EVENT_METRICS_NAMESPACE = "studio"
    families = scrape(client)
    assert "studio_ledger_rows" in families and "eventsite_ledger_rows" not in families


def test_the_dashboard_and_alert_rules_name_only_metrics_the_site_serves(client, settings):
    import json
    import re

    a_night(settings)
    answer = client.get("/metrics")
    served = {s.name for f in text_string_to_metric_families(answer.content.decode()) for s in f.samples}
    dashboard = (ROOT / "docs" / "monitoring" / "grafana-dashboard.json").read_text()
    rules = (ROOT / "docs" / "monitoring" / "alerts.yml").read_text()
    json.loads(dashboard)
    named = set(re.findall(r"\beventsite_[a-z_]+", dashboard + rules))
    assert named, "the files name no metric"
    assert sorted(named - served) == []
    for wanted in ("eventsite_rows_waiting_for_person", "eventsite_backend_up", "eventsite_sweep_passes_total"):
        assert wanted in rules


def test_the_counters_of_calls_made_on_many_threads_add_up(monkeypatch):
    import threading

    counters.forget()
    labels = {"module": "m", "backend": "", "verb": "revert"}

    def count():
        for _ in range(500):
            counters.add_all(
                [("module_calls_total", {**labels, "outcome": "ok"}, 1.0), *counters.observed("t", labels, 0.02)]
            )

    threads = [threading.Thread(target=count) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    pending = counters.pending()
    calls = counters.key_of("module_calls_total", {**labels, "outcome": "ok"})
    assert pending[calls][:2] == ("module_calls_total", {**labels, "outcome": "ok"})
    assert pending[calls][2] == 4000
    assert pending[counters.key_of("t_bucket", {**labels, "le": "0.025"})][2] == 4000
    assert pending[counters.key_of("t_count", labels)][2] == 4000
    assert pending[counters.key_of("t_sum", labels)][2] == pytest.approx(80.0)
    counters.forget()


def test_a_counter_labelled_true_and_one_keeps_each_label_as_written():
    counters.forget()
    counters.add("t_total", {"flag": True})
    counters.add("t_total", {"flag": 1})
    counters.add("t_total", {"flag": "1"})
    pending = counters.pending()
    assert pending[counters.key_of("t_total", {"flag": "True"})][2] == 1
    assert pending[counters.key_of("t_total", {"flag": "1"})][2] == 2
    counters.forget()
