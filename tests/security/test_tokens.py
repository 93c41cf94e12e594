"""API tokens like Knox's: hashed, shown once, expiring, revoked one by one and with the
password or the user's deactivation; failed token authentication throttled per address."""

import io
from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client, override_settings
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

from cleanup.api.tokens import issue
from tests.test_api_access import user_with

pytestmark = pytest.mark.django_db

RUNS = "/api/events/runs/"


def client_with(key, address="10.0.0.1"):
    client = APIClient(REMOTE_ADDR=address)
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def every_stored_text():
    """Every text value of every table, as the database holds it."""
    found = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            found.extend(str(value) for row in cursor.fetchall() for value in row if value is not None)
    return found


def test_the_key_is_nowhere_in_the_database():
    row, key = issue(user_with("view_run"))
    assert client_with(key).get(RUNS).status_code == 200
    stored = every_stored_text()
    assert not [value for value in stored if key in value]
    assert row.token_key == key[:15] and row.digest != key


def test_create_token_prints_the_key_once_and_it_expires_after_the_ttl():
    user_with("view_run")
    out, err = io.StringIO(), io.StringIO()
    call_command("create_token", "console", "--ttl", "2", stdout=out, stderr=err)
    key = out.getvalue().strip()
    assert client_with(key).get(RUNS).status_code == 200
    row = AuthToken.objects.get()
    assert abs(row.expiry - (timezone.now() + timedelta(days=2))) < timedelta(minutes=1)
    assert key not in err.getvalue() and key[:8] in err.getvalue()
    with time_machine.travel(timezone.now() + timedelta(days=2, minutes=1), tick=False):
        assert client_with(key).get(RUNS).status_code == 401


def test_a_token_lasts_event_token_ttl_days_by_default():
    row, _ = issue(user_with("view_run"))
    assert abs(row.expiry - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)
    with override_settings(EVENT_TOKEN_TTL_DAYS=7):
        row, _ = issue(User.objects.create_user("other", is_staff=True))
    assert abs(row.expiry - (timezone.now() + timedelta(days=7))) < timedelta(minutes=1)


def test_create_token_refuses_an_unknown_user_and_a_ttl_out_of_bounds():
    user_with("view_run")
    with pytest.raises(CommandError, match="no user"):
        call_command("create_token", "nobody", stdout=io.StringIO(), stderr=io.StringIO())
    with pytest.raises(CommandError, match="--ttl"):
        call_command("create_token", "console", "--ttl", "0", stdout=io.StringIO(), stderr=io.StringIO())
    assert not AuthToken.objects.exists()


def test_a_password_change_revokes_every_token_of_the_user():
    user = user_with("view_run")
    _, first = issue(user)
    _, second = issue(user)
    _, others = issue(user_with("view_run", username="other"))
    user.set_password("another-pw-987654321")
    user.save()
    assert client_with(first).get(RUNS).status_code == 401
    assert client_with(second).get(RUNS).status_code == 401
    assert client_with(others).get(RUNS).status_code == 200


def test_an_unrelated_save_keeps_the_tokens():
    user = user_with("view_run")
    _, key = issue(user)
    user.first_name = "Ada"
    user.save()
    assert client_with(key).get(RUNS).status_code == 200


def test_deactivating_the_user_revokes_the_tokens_and_the_docs_page_answers_401_not_500():
    user = user_with("view_run")
    _, key = issue(user)
    user.is_active = False
    user.save()
    assert not AuthToken.objects.filter(user=user).exists()
    for path in (RUNS, "/api/docs/", "/api/schema/"):
        assert client_with(key).get(path).status_code == 401, path


def test_an_inactive_users_token_answers_401_everywhere():
    user = user_with("view_run")
    _, key = issue(user)
    User.objects.filter(pk=user.pk).update(is_active=False)  # no save(): the token stays
    for path in (RUNS, "/api/docs/", "/api/schema/", f"{RUNS}1/"):
        answer = client_with(key).get(path)
        assert answer.status_code == 401, (path, answer.status_code)


def test_the_admin_shows_a_prefix_only_and_a_superuser_revokes_one_token():
    user = user_with("view_run")
    row, key = issue(user)
    _, kept = issue(user)
    root = User.objects.create_superuser("root", password="pw-123456789")
    admin = Client()
    admin.force_login(root)
    page = admin.get("/admin/knox/authtoken/").content.decode()
    # The prefix is shown; the key is not stored, so it cannot be. (The row's id in the
    # links is knox's digest, a SHA-512 of the key: it authenticates nothing.)
    assert key[:15] in page and key not in page
    assert admin.get("/admin/knox/authtoken/add/").status_code == 403
    answer = admin.post(
        "/admin/knox/authtoken/", {"action": "delete_selected", "_selected_action": [row.pk], "post": "yes"}
    )
    assert answer.status_code == 302
    assert client_with(key).get(RUNS).status_code == 401
    assert client_with(kept).get(RUNS).status_code == 200


def test_staff_without_the_permission_cannot_revoke_a_token():
    row, key = issue(user_with("view_run"))
    staff = User.objects.create_user("clerk", is_staff=True)
    admin = Client()
    admin.force_login(staff)
    admin.post("/admin/knox/authtoken/", {"action": "delete_selected", "_selected_action": [row.pk], "post": "yes"})
    assert client_with(key).get(RUNS).status_code == 200


@override_settings(EVENT_TOKEN_FAILURE_LIMIT=5, EVENT_TOKEN_FAILURE_WINDOW_S=60)
def test_guessed_tokens_from_one_address_are_refused_after_the_limit_while_a_valid_token_still_works():
    _, key = issue(user_with("view_run"))
    for n in range(5):
        assert client_with(f"{n:064x}").get(RUNS).status_code == 401
    answer = client_with("f" * 64).get(RUNS)
    assert answer.status_code == 429
    assert 1 <= int(answer["Retry-After"]) <= 60
    # A console behind the same address (a NAT) keeps working with its own token ...
    assert client_with(key).get(RUNS).status_code == 200
    # ... while guesses from there stay refused, and another address is not held up.
    assert client_with("e" * 64).get(RUNS).status_code == 429
    assert client_with("e" * 64, address="10.0.0.2").get(RUNS).status_code == 401
    with time_machine.travel(timezone.now() + timedelta(seconds=61), tick=False):
        assert client_with("e" * 64).get(RUNS).status_code == 401


@override_settings(EVENT_TOKEN_FAILURE_LIMIT=5, EVENT_TOKEN_FAILURE_WINDOW_S=60)
def test_a_token_prefix_guessed_too_often_from_an_address_is_refused_there_the_right_key_too():
    _, key = issue(user_with("view_run"))
    wrong_rest = key[:15] + ("0" if key[15] != "0" else "1") + key[16:]
    for _ in range(5):
        assert client_with(wrong_rest).get(RUNS).status_code == 401
    answer = client_with(key).get(RUNS)
    assert answer.status_code == 429 and 1 <= int(answer["Retry-After"]) <= 60
    # From another address the token works, and here again once the window has passed.
    assert client_with(key, address="10.0.0.2").get(RUNS).status_code == 200
    with time_machine.travel(timezone.now() + timedelta(seconds=61), tick=False):
        assert client_with(key).get(RUNS).status_code == 200


def test_the_token_lockout_trips_at_the_twentieth_failure_by_default():
    for n in range(20):
        assert client_with(f"{n:064x}").get(RUNS).status_code == 401, n
    assert client_with("f" * 64).get(RUNS).status_code == 429


def test_a_token_that_cannot_be_one_is_a_401_not_a_500():
    for bad in ("\x00" * 20, "zz" * 32, "0" * 500, "é" * 20):
        client = APIClient(REMOTE_ADDR="10.0.0.9")
        client.credentials(HTTP_AUTHORIZATION="Token " + bad)
        assert client.get(RUNS).status_code == 401, bad


def test_the_migration_hashes_the_old_plain_text_tokens_and_they_keep_working():
    import importlib
    from types import SimpleNamespace

    from django.apps import apps

    migration = importlib.import_module("cleanup.migrations.0016_api_tokens_are_stored_hashed")
    user = user_with("view_run")
    old_key = "0123456789abcdef0123456789abcdef01234567"  # DRF's shape: 40 hex
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, user_id integer, created timestamp)")
        cursor.execute("INSERT INTO authtoken_token (key, user_id) VALUES (%s, %s)", [old_key, user.pk])
    # The data migration reads only its schema editor's connection: the test's own stands in.
    migration.hash_old_tokens(apps, SimpleNamespace(connection=connection))
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM authtoken_token")
        assert cursor.fetchone()[0] == 0
    assert not [value for value in every_stored_text() if old_key in value]
    assert client_with(old_key).get(RUNS).status_code == 200
    row = AuthToken.objects.get(user=user)
    assert abs(row.expiry - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)


def token_queries(key, path=RUNS):
    """The queries one request makes that read tokens or permissions, and its status."""
    from django.db import connection as db
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(db) as seen:
        status = client_with(key).get(path).status_code
    reads = [q["sql"] for q in seen.captured_queries if "knox_authtoken" in q["sql"] or "permission" in q["sql"]]
    return status, reads


def test_a_token_asked_again_within_the_bound_is_answered_from_the_processs_memory():
    _, key = issue(user_with("view_run"))
    status, first = token_queries(key)
    assert status == 200 and first, "the first request reads the token and the permissions"
    status, again = token_queries(key)
    assert (status, again) == (200, [])


@override_settings(EVENT_TOKEN_AUTH_MEMORY_S=0)
def test_with_no_memory_every_request_reads_the_token_again():
    _, key = issue(user_with("view_run"))
    token_queries(key)
    status, again = token_queries(key)
    assert status == 200 and again


def test_a_token_revoked_in_this_process_is_refused_at_once():
    row, key = issue(user_with("view_run"))
    assert client_with(key).get(RUNS).status_code == 200
    row.delete()
    assert client_with(key).get(RUNS).status_code == 401


def test_a_permission_taken_away_in_this_process_holds_at_once():
    from django.contrib.auth.models import Permission

    user = user_with("view_run")
    _, key = issue(user)
    assert client_with(key).get(RUNS).status_code == 200
    user.user_permissions.remove(Permission.objects.get(codename="view_run"))
    assert client_with(key).get(RUNS).status_code == 403


def test_a_token_revoked_by_another_process_is_refused_once_the_bound_has_passed(monkeypatch):
    import time as real_time
    from types import SimpleNamespace

    from cleanup.api import tokens

    monkeypatch.setattr(tokens, "_listeners", 0)  # no change feed listening here (another test's hub)
    _, key = issue(user_with("view_run"))
    assert client_with(key).get(RUNS).status_code == 200
    # Another process deletes the token: no signal reaches this one.
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM knox_authtoken")
    assert client_with(key).get(RUNS).status_code == 200, "remembered, within the bound"
    later = real_time.monotonic() + 6  # EVENT_TOKEN_AUTH_MEMORY_S is 5
    monkeypatch.setattr(tokens, "time", SimpleNamespace(time=real_time.time, monotonic=lambda: later))
    assert client_with(key).get(RUNS).status_code == 401


def test_a_counters_cache_that_fails_lets_valid_tokens_in_and_still_refuses_wrong_ones(monkeypatch):
    from cleanup import limits

    class Broken:
        def get_many(self, *args, **kwargs):
            raise ConnectionError("redis is not answering")

        set_many = get_many

    _, key = issue(user_with("view_run"))
    monkeypatch.setattr(limits, "counters", Broken)
    assert client_with(key).get(RUNS).status_code == 200
    assert client_with("f" * 64).get(RUNS).status_code == 401


# The memory of a process that listens: emptied by every change on the site ------------------


def notices_of(conn):
    return [notice.channel for notice in conn.notifies(timeout=0.5)]


@pytest.mark.django_db(transaction=True)
def test_a_change_of_a_token_a_user_or_a_permission_notifies_every_listening_process_on_commit():
    import psycopg
    from django.contrib.auth.models import Permission
    from django.db import transaction

    from cleanup.api import tokens, waiting

    user = user_with("view_run")
    row, _ = issue(user)
    with psycopg.connect(waiting.conninfo(), autocommit=True) as other:
        other.execute(f"LISTEN {tokens.CHANNEL}")
        with transaction.atomic():
            row.delete()
            assert notices_of(other) == [], "told on commit, not before"
        assert tokens.CHANNEL in notices_of(other)
        with transaction.atomic():
            user.user_permissions.remove(Permission.objects.get(codename="view_run"))
            transaction.set_rollback(True)
        assert notices_of(other) == [], "a change rolled back tells nobody"
        from django.contrib.auth.models import update_last_login

        update_last_login(None, user)
        assert notices_of(other) == [], "a login's last_login changes no authentication"
        user.is_active = False
        user.save()
        assert tokens.CHANNEL in notices_of(other)


@pytest.mark.django_db(transaction=True)
def test_a_listening_process_remembers_past_the_short_bound_and_forgets_when_another_process_tells_it(
    monkeypatch,
):
    import asyncio
    import time as real_time
    from types import SimpleNamespace

    import psycopg
    from asgiref.sync import async_to_sync, sync_to_async

    from cleanup.api import tokens, waiting

    monkeypatch.setattr(tokens, "_listeners", 0)  # no other test's hub counted
    _, key = issue(user_with("view_run"))
    assert tokens.memory_s() == 5, "no listener yet: the short bound"

    async def listening():
        hub = waiting.hub()
        async with asyncio.timeout(10):
            while not hub.ready:
                await asyncio.sleep(0.01)
        seconds = tokens.memory_s()
        get = sync_to_async(lambda: client_with(key).get(RUNS).status_code, thread_sensitive=False)
        statuses = [await get()]
        # Another process deletes the token, as SQL would (no signal here), then tells.
        async with await psycopg.AsyncConnection.connect(waiting.conninfo(), autocommit=True) as other:
            await other.execute("DELETE FROM knox_authtoken")
            later = real_time.monotonic() + 30  # past EVENT_TOKEN_AUTH_MEMORY_S, within ..._WATCHED_S
            monkeypatch.setattr(tokens, "time", SimpleNamespace(time=real_time.time, monotonic=lambda: later))
            statuses.append(await get())  # remembered: nobody told this process yet
            await other.execute("SELECT pg_notify(%s, '')", [tokens.CHANNEL])
        async with asyncio.timeout(10):
            while tokens._remembered:
                await asyncio.sleep(0.01)
        statuses.append(await get())
        hub.task.cancel()
        await asyncio.gather(hub.task, return_exceptions=True)
        return seconds, statuses

    seconds, statuses = async_to_sync(listening)()
    assert seconds == 60
    assert statuses == [200, 200, 401]
    assert tokens.memory_s() == 5, "the listener stopped: the short bound again"


def test_an_authentication_that_read_while_the_memory_was_emptied_is_not_remembered(monkeypatch):
    from knox.auth import TokenAuthentication as Knox

    from cleanup.api import tokens

    _, key = issue(user_with("view_run"))
    original = Knox.authenticate

    def read_then_told(self, request):
        found = original(self, request)
        tokens.forget()  # a change committed while the token was read
        return found

    monkeypatch.setattr(Knox, "authenticate", read_then_told)
    assert client_with(key).get(RUNS).status_code == 200
    assert tokens._remembered == {}
    monkeypatch.setattr(Knox, "authenticate", original)
    assert client_with(key).get(RUNS).status_code == 200
    assert len(tokens._remembered) == 1
