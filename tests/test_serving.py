"""Under ASGI the middleware runs on the event loop, and goes to a thread only to reach the
database (cleanup.serving): same answers as under WSGI, sessions still saved."""

import asyncio

import pytest
from asgiref.sync import SyncToAsync, async_to_sync
from django.conf import settings
from django.test import AsyncClient, Client
from django.test.client import AsyncClientHandler
from django.utils.module_loading import import_string

from cleanup import serving
from cleanup.api.tokens import issue
from cleanup.security import LAST_SEEN, IdleSessionTimeout
from tests.test_api_access import API, user_with

CHANGES = API + "changes/"


class HookThreads:
    """Which middleware hooks were handed to a thread (`sync_to_async`), by class and hook."""

    def __init__(self, monkeypatch):
        self.sent: list[tuple[str, str]] = []
        original = SyncToAsync.__init__

        def spying(spied, func, *args, **kwargs):
            owner = getattr(func, "__self__", None)
            name = getattr(func, "__name__", "")
            if owner is not None and name.startswith("process_"):
                self.sent.append((type(owner).__name__, name))
            original(spied, func, *args, **kwargs)

        monkeypatch.setattr(SyncToAsync, "__init__", spying)


class SiteClientHandler(serving.CounterpartChain, AsyncClientHandler):
    """The test client's ASGI handler with the site's chain (as `cleanup.serving.ASGIHandler`)."""


def site_client():
    client = AsyncClient()
    client.handler = SiteClientHandler()
    return client


def asgi_get(path, **headers):
    async def ask():
        return await site_client().get(path, headers=headers)

    return async_to_sync(ask)()


def test_the_sites_asgi_handler_serves_every_middleware_on_the_loop_and_wsgi_serves_djangos():
    """The site lists Django's own classes (its checks look for them by name); the ASGI
    handler builds its chain with their counterparts, the WSGI one with the originals."""
    from django.core.handlers.wsgi import WSGIHandler

    from eventsite.asgi import application

    def chain(handler):
        found, layer = [], handler._middleware_chain
        while layer is not None:
            inner = getattr(layer, "__wrapped__", layer)  # convert_exception_to_response
            found.append(inner)
            layer = getattr(inner, "get_response", None)
        return [type(m) for m in found if not isinstance(m, type(lambda: None)) and hasattr(m, "get_response")]

    served = chain(application)
    assert len(served) == len(settings.MIDDLEWARE)
    mine = {cls for cls in served if issubclass(cls, serving.OnTheLoop)}
    assert set(serving.COUNTERPARTS.values()) <= mine
    listed = {path.rsplit(".", 1)[1] for path in settings.MIDDLEWARE}
    assert {cls.__name__ for cls in served} == listed
    # Whatever a listed class is not a counterpart of passes requests on on the loop itself.
    assert all(getattr(cls, "async_capable", False) for cls in served)
    under_wsgi = chain(WSGIHandler())
    assert [f"{c.__module__}.{c.__name__}" for c in under_wsgi] == [
        import_string(path).__module__ + "." + import_string(path).__name__ for path in settings.MIDDLEWARE
    ]


@pytest.mark.django_db(transaction=True)  # the feed's checks run on its own threads under ASGI
def test_an_api_read_with_a_token_runs_no_middleware_hook_on_a_thread_and_answers_as_under_wsgi(monkeypatch):
    key = issue(user_with("view_runlog", "view_moduleevent"))[1]
    spy = HookThreads(monkeypatch)
    under_asgi = asgi_get(CHANGES, Authorization=f"Token {key}")
    assert spy.sent == []
    under_wsgi = Client().get(CHANGES, headers={"Authorization": f"Token {key}"})
    assert under_asgi.status_code == under_wsgi.status_code == 200
    # The headers the middleware writes are all there: security, CSP, framing, storing, rates.
    for name in (
        "X-Content-Type-Options",
        "Referrer-Policy",
        "Cross-Origin-Opener-Policy",
        "Content-Security-Policy",
        "X-Frame-Options",
        "Cache-Control",
        "RateLimit-Limit",
    ):
        assert under_asgi.get(name) == under_wsgi.get(name) is not None, name
    # One request later, one fewer left.
    assert int(under_asgi["RateLimit-Remaining"]) == int(under_wsgi["RateLimit-Remaining"]) + 1


@pytest.mark.django_db
def test_a_path_with_a_control_character_is_refused_on_the_loop_as_under_wsgi(monkeypatch):
    spy = HookThreads(monkeypatch)
    answer = asgi_get(API + "runs/%01/")
    assert spy.sent == []
    assert (answer.status_code, answer["Content-Type"]) == (404, "application/json")


@pytest.mark.django_db
def test_a_signed_in_session_under_asgi_is_read_and_saved_on_the_requests_thread(monkeypatch, admin_user):
    """The session's cookie sends the session's reads and the save to a thread (the event
    loop may not touch the database): the admin's pages work, the idle clock is written."""
    monkeypatch.setattr(settings, "SESSION_IDLE_TIMEOUT", 3600, raising=False)
    monkeypatch.setattr(IdleSessionTimeout, "WRITE_EVERY_S", 0)  # every page writes the clock
    spy = HookThreads(monkeypatch)

    async def visit():
        client = site_client()
        await client.aforce_login(admin_user)
        page = await client.get("/admin/")
        return page, client

    page, client = async_to_sync(visit)()
    assert page.status_code == 200
    assert LAST_SEEN in client.session
    assert ("IdleSessionTimeout", "process_request") in spy.sent
    assert ("IdleSessionTimeout", "process_view") in spy.sent
    # The admin's index wrote the idle clock: the session was saved, on a thread.
    assert ("SessionMiddleware", "process_response") in spy.sent
    # Nothing without a reason to: the headers' hooks stayed on the loop.
    assert not [hook for hook in spy.sent if hook[0] in ("SecurityMiddleware", "XFrameOptionsMiddleware")]


@pytest.mark.django_db
def test_a_login_under_asgi_saves_its_session_and_the_next_page_is_signed_in(admin_user):
    async def sign_in():
        client = site_client()
        page = await client.get("/admin/login/")
        csrf = page.cookies["csrftoken"].value
        done = await client.post(
            "/admin/login/?next=/admin/",
            {"username": admin_user.username, "password": "password", "csrfmiddlewaretoken": csrf},
        )
        after = await client.get("/admin/")
        return done, after

    done, after = async_to_sync(sign_in)()
    assert (done.status_code, done["Location"]) == (302, "/admin/")
    assert after.status_code == 200


def test_every_hook_of_a_mixed_middleware_is_awaitable_under_asgi_and_plain_under_wsgi():
    def sync_handler(request):
        return "sync"

    async def async_handler(request):
        return "async"

    under_wsgi = serving.CsrfViewMiddleware(sync_handler)
    under_asgi = serving.CsrfViewMiddleware(async_handler)
    assert not asyncio.iscoroutinefunction(under_wsgi.process_view)
    assert asyncio.iscoroutinefunction(under_asgi.process_view)


async def through_the_site(path, headers=()):
    """One request through the site's own ASGI application (`eventsite.asgi`)."""
    from eventsite.asgi import application

    path, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    sent, asked = [], asyncio.Event()

    async def receive():
        if not asked.is_set():
            asked.set()
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    await application(scope, receive, send)
    return sent[0]["status"]


def test_the_feed_runs_on_its_own_threads_and_every_other_view_on_the_sites():
    from cleanup.api import waiting

    assert serving.threads_for(CHANGES) is waiting.executor()
    assert serving.threads_for("/healthz") is serving.request_threads()
    assert serving.threads_for(API + "runs/") is serving.request_threads()
    assert serving.threads_for("/no/such/page") is serving.request_threads()


@pytest.mark.django_db(transaction=True)
def test_the_sites_handler_starts_no_thread_per_request_and_gives_back_every_connection(monkeypatch):
    """Django's handler starts two threads per request (one to run it, one to join it); the
    site's runs every request on its few threads, which give back what they opened."""
    import threading

    from cleanup.api import waiting

    key = issue(user_with("view_runlog", "view_moduleevent", "view_resource"))[1]
    token = [(b"authorization", f"Token {key}".encode())]
    started = []
    original = threading.Thread.start

    def start(thread):
        started.append(thread.name)
        original(thread)

    monkeypatch.setattr(threading.Thread, "start", start)

    async def many():
        started.clear()  # the test's own loop's thread (async_to_sync) aside
        statuses = []
        for _ in range(15):
            statuses.append(await through_the_site("/healthz"))
            statuses.append(await through_the_site(API + "resources/", token))
            statuses.append(await through_the_site(CHANGES + "?after=0", token))
        return statuses

    statuses = async_to_sync(many)()
    assert set(statuses) <= {200, 503}  # /healthz is 503 with no cluster's tick: it still answered
    assert statuses.count(200) >= 30
    assert len(started) <= settings.ASGI_THREADS + waiting.THREADS
    assert not [name for name in started if "join" in name or name.startswith("ThreadPoolExecutor")]
    # Every connection the threads opened was given back: the pool holds them all again.
    assert all(connection.connection is None for connection in _connections_of(serving.request_threads()))


def _connections_of(threads):
    """The database connections each of ``threads``' threads holds now (asked on each)."""
    from django.db import connections

    def held():
        return [c for c in connections.all(initialized_only=True) if c.connection is not None]

    found = []
    futures = [threads.submit(held) for _ in range(threads._max_workers)]
    for future in futures:
        found += future.result()
    return found
