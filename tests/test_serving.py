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
    assert set(serving.COUNTERPARTS.values()) <= set(served)
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


def test_a_parked_long_poll_leaves_its_turn_and_the_next_request_is_served_meanwhile():
    """With one turn, a request parked (stepped aside) does not hold it: a second request is
    served while the first still waits."""
    ended = []

    async def scenario():
        async def parked():
            async with serving.turn_taken(1):
                async with serving.step_aside():
                    await asyncio.sleep(0.2)
                ended.append("parked")

        async def plain():
            async with serving.turn_taken(1):
                ended.append("plain")

        first = asyncio.create_task(parked())
        await asyncio.sleep(0.01)  # parked now
        await asyncio.gather(first, asyncio.create_task(plain()))
        return serving.Turn(1).turns

    turns = async_to_sync(scenario)()
    assert ended == ["plain", "parked"]
    assert not turns.locked()  # every turn given back


def test_turns_bound_the_requests_served_at_once_in_the_order_they_came():
    async def scenario():
        serving_now, most, order = 0, 0, []

        async def request(number):
            nonlocal serving_now, most
            async with serving.turn_taken(3):
                serving_now += 1
                most = max(most, serving_now)
                order.append(number)
                await asyncio.sleep(0.01)  # its work, during which others may come
                serving_now -= 1

        await asyncio.gather(*(request(n) for n in range(20)))
        return most, order

    most, order = async_to_sync(scenario)()
    assert most == 3
    assert order == list(range(20))


def test_a_request_cancelled_while_waiting_for_its_turn_again_gives_back_nothing_it_lacks():
    """A client gone while its long poll waits to take its turn back: the turn count stays
    whole (none lost, none added)."""

    async def scenario():
        holder = serving.Turn(1)

        async def parked_then_cancelled():
            async with serving.turn_taken(1):
                async with serving.step_aside():
                    await asyncio.sleep(0.01)
                # here it waits to take the turn back, which the holder below keeps

        task = asyncio.create_task(parked_then_cancelled())
        await asyncio.sleep(0.005)
        await holder.take()  # taken while the other is parked
        await asyncio.sleep(0.05)  # the other now waits for it
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        holder.give()
        return holder.turns

    turns = async_to_sync(scenario)()
    assert turns._value == 1 and not turns.locked()


def test_a_request_that_leaves_its_turn_takes_none_again_and_gives_back_none_twice():
    """An event stream leaves its turn once it has begun: its waits take none back, and the
    end of the request gives back nothing more (the turns stay as many)."""

    async def request():
        async with serving.turn_taken(2) as turn:
            serving.leave_turn()
            async with serving.step_aside():
                await asyncio.sleep(0)
            held_after_wait = turn.held
        return held_after_wait, turn.turns._value

    async def scenario():
        return await asyncio.create_task(request())

    assert async_to_sync(scenario)() == (False, 2)


def test_a_request_that_takes_no_turns_steps_aside_freely():
    async def scenario():
        async with serving.step_aside():
            await asyncio.sleep(0)
        return serving._turn.get()

    assert async_to_sync(scenario)() is None


def test_the_feed_takes_turns_and_no_other_view_does():
    from cleanup.api import waiting

    assert serving.turns_for(CHANGES) == waiting.TURNS
    assert serving.turns_for("/healthz") is None
    assert serving.turns_for(API + "resources/") is None


@pytest.mark.django_db(transaction=True)
def test_under_the_sites_handler_a_parked_long_poll_lets_the_next_ask_through(monkeypatch):
    """Through `eventsite.asgi` with the feed's turns at 1: a long poll waiting for a change
    holds no turn, so an ask that needs no wait is answered before it."""
    from cleanup import feed

    key = issue(user_with("view_runlog", "view_moduleevent"))[1]
    token = [(b"authorization", f"Token {key}".encode())]
    monkeypatch.setattr(serving, "turns_for", lambda path: 1 if path == CHANGES else None)
    feed.stamp()
    last = feed.entries_after(0, 10_000, None, None)
    after = last[-1]["id"] if last else 0
    ended = []

    async def ask(query, name):
        status = await through_the_site(CHANGES + query, token)
        ended.append((name, status))

    async def both():
        waiter = asyncio.create_task(ask(f"?after={after}&wait=2", "long poll"))
        await asyncio.sleep(0.5)  # it has been checked and parked
        await ask("?after=0", "plain")
        await waiter

    async_to_sync(both)()
    assert ended == [("plain", 200), ("long poll", 200)]


@pytest.mark.django_db
def test_a_locked_out_login_under_asgi_answers_as_under_wsgi(admin_user):
    """django-axes' lockout through the site's counterpart of its middleware: the same 429,
    its Retry-After and its words, under both handlers."""
    from tests.security.test_lockout import LOGIN

    def wrong_then_right(post):
        for _ in range(5):
            post({"username": admin_user.username, "password": "wrong"})
        return post({"username": admin_user.username, "password": "password"})

    async def asgi():
        client = site_client()  # its handler checks CSRF, as a browser's requests are
        csrf = (await client.get("/admin/login/")).cookies["csrftoken"].value

        async def post(data):
            return await client.post(LOGIN, {**data, "next": "/admin/", "csrfmiddlewaretoken": csrf})

        answers = [await post({"username": admin_user.username, "password": "wrong"}) for _ in range(5)]
        return answers, await post({"username": admin_user.username, "password": "password"})

    _, under_asgi = async_to_sync(asgi)()
    from axes.models import AccessAttempt

    AccessAttempt.objects.all().delete()
    client = Client()
    under_wsgi = wrong_then_right(lambda data: client.post(LOGIN, {**data, "next": "/admin/"}))
    assert under_asgi.status_code == under_wsgi.status_code == 429
    assert under_asgi["Retry-After"] == under_wsgi["Retry-After"] == "900"
    assert "locked out" in under_asgi.content.decode()


def test_the_app_loads_its_serving_without_django_axes_installed(tmp_path):
    """A project may list the app without django-axes: importing `cleanup.serving` imports
    none of it (its models would refuse to load outside INSTALLED_APPS)."""
    import subprocess
    import sys

    (tmp_path / "bare_settings.py").write_text(
        "SECRET_KEY = 'x'\nINSTALLED_APPS = ['django.contrib.auth', 'django.contrib.contenttypes']\n"
        "DATABASES = {}\nUSE_TZ = True\n"
    )
    code = (
        "import sys, django; django.setup(); import cleanup.serving as s\n"
        "assert 'axes.models' not in sys.modules, 'axes was imported'\n"
        "assert 'axes.middleware.AxesMiddleware' in s.COUNTERPARTS\n"
    )
    path = f"{tmp_path}:{settings.BASE_DIR}"
    env = {"PYTHONPATH": path, "DJANGO_SETTINGS_MODULE": "bare_settings", "PATH": "/usr/bin"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_an_answer_that_used_no_message_makes_no_message_storage():
    from django.contrib import messages
    from django.contrib.sessions.backends.signed_cookies import SessionStore
    from django.http import HttpResponse
    from django.test import RequestFactory

    middleware = serving.MessageMiddleware(lambda request: HttpResponse("ok"))
    quiet = RequestFactory().get("/api/v1/runs/")
    quiet.session = SessionStore()
    middleware.process_request(quiet)
    answer = middleware.process_response(quiet, HttpResponse("ok"))
    assert not serving.made(quiet._messages)
    assert "messages" not in answer.cookies
    assert not middleware.needs_thread(serving.RESPONSE, quiet, answer)

    # One that adds a message stores it as Django's would (a cookie here), read next time.
    told = RequestFactory().get("/admin/")
    told.session = SessionStore()
    middleware.process_request(told)
    messages.info(told, "The run was cancelled.")
    assert middleware.needs_thread(serving.RESPONSE, told, None)
    answer = middleware.process_response(told, HttpResponse("ok"))
    assert serving.made(told._messages)
    later = RequestFactory().get("/admin/", HTTP_COOKIE=f"messages={answer.cookies['messages'].value}")
    later.session = SessionStore()
    middleware.process_request(later)
    assert [str(m) for m in messages.get_messages(later)] == ["The run was cancelled."]


def test_the_idle_clock_reads_no_user_for_a_request_without_a_session_cookie(monkeypatch):
    from django.test import RequestFactory
    from django.utils.functional import SimpleLazyObject

    monkeypatch.setattr(settings, "SESSION_IDLE_TIMEOUT", 3600, raising=False)

    def read_user():
        raise AssertionError("the user was read")

    request = RequestFactory().get("/api/v1/changes/")
    request.session = {}
    request.user = SimpleLazyObject(read_user)
    clock = IdleSessionTimeout(lambda r: None)
    assert clock.process_request(request) is None
    assert clock.process_view(request, lambda r: None, (), {}) is None


def test_a_settled_heap_keeps_what_start_up_made_out_of_the_collectors_passes():
    """In a process of its own, as a worker's: 0 changes nothing; a threshold freezes what
    the site made as it loaded (its views included) and sets the youngest generation's."""
    import subprocess
    import sys

    code = (
        "import gc, django; django.setup()\n"
        "from cleanup.serving import settle_the_heap\n"
        "before = gc.get_threshold()\n"
        "settle_the_heap(0)\n"
        "print(gc.get_threshold() == before, gc.get_freeze_count())\n"
        "settle_the_heap(25000)\n"
        "print(gc.get_threshold() == (25000, *before[1:]), gc.get_freeze_count(),"
        " 'cleanup.api.feed' in __import__('sys').modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    (unchanged, none_frozen), (set_, frozen, views_loaded) = (line.split() for line in done.stdout.splitlines())
    assert (unchanged, none_frozen) == ("True", "0")
    assert (set_, views_loaded) == ("True", "True")
    assert int(frozen) > 50_000
