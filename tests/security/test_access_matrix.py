"""The access matrix (issue 20): every URL pattern of the site x every role x every method.

The patterns are read from the site's URL resolver, so a new page or endpoint without a row
in the tables below fails `test_every_url_pattern_has_a_row_in_the_matrix` until someone
says who may use it. For each role, every pattern is requested with every method, and the
answer must be what the tables say: allowed (neither refused nor an error), refused (401 or
403, 405 for a method the endpoint does not have, or the admin's login page for who is not
active staff), and never a 5xx. The API's table is docs/api.md's; the admin's is the model
permissions (`view_<model>` for its pages; nothing adds, changes or deletes our rows).
"""

import re

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.urls import URLPattern, URLResolver, get_resolver
from django_q.models import OrmQ, Schedule, Task

from cleanup import registry
from cleanup.api.tokens import issue
from cleanup.models import Alert, ModuleEvent, ModuleHealth, Resource, RunLog, RunStatus
from tests.fakes import FakeAction, FakeLease, Scripted, make_lease_row, make_rows, make_run, make_step

pytestmark = pytest.mark.django_db

METHODS = ("get", "head", "options", "post", "put", "patch", "delete")

CLEANUP_VIEWS = ("view_run", "view_resource", "view_runlog", "view_step", "view_modulehealth", "view_moduleevent")
CLEANUP_VIEWS += ("view_alert",)
OPERATOR = (*CLEANUP_VIEWS, "add_run", "change_run", "cleanup_run")

# role -> (is_staff, is_active, is_superuser, cleanup permissions)
ROLES = {
    "anonymous": None,
    "outsider": (False, True, False, OPERATOR),  # every permission, not staff
    "inactive": (True, False, False, OPERATOR),  # staff, deactivated
    "staff": (True, True, False, ()),  # staff, no permission
    "run_viewer": (True, True, False, ("view_run",)),  # the issue's user with only view_run
    "reader": (True, True, False, CLEANUP_VIEWS),
    "operator": (True, True, False, OPERATOR),
    "superuser": (True, True, True, ()),
}

# The API: URL name -> {method: the permissions it needs}. A method not listed is 405 for
# staff; HEAD is GET's, OPTIONS needs staff only.
API = {
    "events-runs": {"GET": {"view_run"}, "POST": {"add_run"}},
    "events-run": {"GET": {"view_run"}},
    "events-run-cancel": {"POST": {"change_run"}},
    "events-run-cleanup": {"POST": {"cleanup_run"}},
    "events-run-cleanup-plan": {"GET": {"view_run", "view_resource"}},
    "events-run-resources": {"GET": {"view_resource"}},
    "events-run-log": {"GET": {"view_runlog"}},
    "events-resources": {"GET": {"view_resource"}},
    "events-resource": {"GET": {"view_resource"}},
    "events-resource-waive": {"POST": {"cleanup_run"}},
    "events-run-waive": {"POST": {"cleanup_run"}},
    "events-modules": {"GET": {"view_modulehealth"}},
    "events-modules-log": {"GET": {"view_moduleevent"}},
    "events-module-down": {"POST": {"cleanup_run"}},
    "events-module-up": {"POST": {"cleanup_run"}},
    "events-module-log": {"GET": {"view_moduleevent"}},
    "events-module-reconcile": {"POST": {"cleanup_run"}},
    "events-backend-down": {"POST": {"cleanup_run"}},
    "events-backend-up": {"POST": {"cleanup_run"}},
    "events-backend-reconcile": {"POST": {"cleanup_run"}},
    "events-summary": {"GET": {"view_run", "view_resource"}},
    "events-changes": {"GET": {"view_runlog", "view_moduleevent"}},
    # The schema and its page: staff, no model permission.
    "schema": {"GET": set()},
    "api-docs": {"GET": set()},
}

# The admin's model pages: (app, model) -> the permission its pages need. Our models are
# read-only: their add, change (POST) and delete pages refuse everyone but a superuser's
# reading; the other apps' (auth, tokens, django-q2) pages are the superuser's here.
ADMIN_MODELS = {
    ("cleanup", "run"): "view_run",
    ("cleanup", "resource"): "view_resource",
    ("cleanup", "runlog"): "view_runlog",
    ("cleanup", "step"): "view_step",
    ("cleanup", "modulehealth"): "view_modulehealth",
    ("cleanup", "moduleevent"): "view_moduleevent",
    ("cleanup", "alert"): "view_alert",
    ("auth", "user"): None,
    ("auth", "group"): None,
    ("knox", "authtoken"): None,
    ("axes", "accessattempt"): None,
    ("axes", "accessfailurelog"): None,
    ("axes", "accesslog"): None,
    ("django_q", "schedule"): None,
    ("django_q", "success"): None,
    ("django_q", "failure"): None,
    ("django_q", "ormq"): None,
}

# The other apps' pages that add nothing, for anyone.
READ_ONLY = {("django_q", "success"), ("django_q", "failure"), ("django_q", "ormq")}
# Records nobody writes by hand, not even a superuser: logins (django-axes) and tokens
# (made by `create_token`, shown once). A superuser lifts a lockout by deleting its attempt
# and revokes a token by deleting it; the logs of logins are kept.
RECORDS = {("axes", "accessattempt"), ("axes", "accessfailurelog"), ("axes", "accesslog"), ("knox", "authtoken")}
KEPT = {("axes", "accessfailurelog"), ("axes", "accesslog")}

# Site pages outside the API and the admin's model pages: by route, who may, and the methods
# the page has (another is 405, refused).
OPEN = "open"  # anyone (a probe, the login page)
ADMIN_STAFF = "active staff"  # the admin's own pages
NOBODY = "nobody"  # the admin's autocomplete, asked about no field (OPTIONS only, for staff)
ANY = "any"  # any answer but an error (logging out)
ALL = frozenset(m.upper() for m in METHODS)
READ = frozenset({"GET", "HEAD", "OPTIONS"})
APP_LIST = "admin/<app_label>/"
SITE = {
    "": (OPEN, {"GET", "HEAD"}),  # redirects to the admin
    "healthz": (OPEN, {"GET", "HEAD"}),
    # Loopback only unless EVENT_METRICS_TOKEN is set (tests/test_metrics.py); the test
    # client's address is loopback.
    "metrics": (OPEN, {"GET", "HEAD"}),
    "admin/": (ADMIN_STAFF, ALL),
    "admin/login/": (OPEN, READ | {"POST", "PUT"}),
    "admin/logout/": (ANY, ALL),
    "admin/password_change/": (ADMIN_STAFF, READ | {"POST", "PUT"}),
    "admin/password_change/done/": (ADMIN_STAFF, READ),
    "admin/autocomplete/": (NOBODY, set()),
    "admin/jsi18n/": (ADMIN_STAFF, READ),
    "admin/r/<path:content_type_id>/<path:object_id>/": (ADMIN_STAFF, ALL),
    # The admin's page of one app; its pattern lists the apps in the order they registered.
    APP_LIST: (ADMIN_STAFF, ALL),
    "admin/(?P<url>.*)$": (ADMIN_STAFF, ALL),
    # The index's live fragment: any active staff member; each count is its permission's.
    "admin/cleanup/run/live-index/": (ADMIN_STAFF, {"GET", "HEAD"}),
}


def patterns(resolver=None, prefix="", namespace=""):
    """Every URL pattern of the site: (route, name), the route as written."""
    resolver = resolver or get_resolver()
    for pattern in resolver.url_patterns:
        if isinstance(pattern, URLResolver):
            inner = f"{namespace}:{pattern.namespace}".strip(":") if pattern.namespace else namespace
            yield from patterns(pattern, prefix + str(pattern.pattern), inner)
        elif isinstance(pattern, URLPattern):
            yield prefix + str(pattern.pattern), pattern.name


MODEL_PAGE = re.compile(r"^admin/(?P<app>\w+)/(?P<model>\w+)/(?P<rest>.*)$")


LEGACY, CURRENT = "api/events/", "api/v1/events/"
APP_LIST_ROUTE = re.compile(r"^admin/\^\(\?P<app_label>[\w|]+\)/\$$")


def page_of(route, name):
    """What the matrix knows of a route: ("api", name), ("model", app, model, page) or ("site", route).

    The deprecated prefix's routes have no names: each is its v1 route's row."""
    if name is None and route.startswith(LEGACY):
        name = dict(patterns()).get(CURRENT + route[len(LEGACY) :])
    if name in API:
        return ("api", name)
    if APP_LIST_ROUTE.match(route):
        return ("site", APP_LIST)
    if route in SITE:
        return ("site", route)
    found = MODEL_PAGE.match(route)
    if found and (found["app"], found["model"]) in ADMIN_MODELS:
        rest = found["rest"]
        page = {
            "": "changelist",
            "add/": "add",
            "<path:object_id>/": "redirect",
            "<path:object_id>/change/": "change",
            "<path:object_id>/history/": "history",
            "<path:object_id>/delete/": "delete",
            "<id>/password/": "password",
            "mark-down/": "mark_down",
            # The live fragments a page reads again (cleanup.admin.live): the list's and the run's.
            "live/": "live",
            "<int:object_id>/live/": "live",
            # Run again (add_run beside view_run) and End now (change_run): their own rows below.
            "<int:object_id>/again/": "again",
            "<int:object_id>/end/": "end",
        }.get(rest)
        if page:
            return ("model", found["app"], found["model"], page)
    return None


def test_every_url_pattern_has_a_row_in_the_matrix():
    missing = [(route, name) for route, name in patterns() if page_of(route, name) is None]
    assert missing == [], f"add these to the access matrix: {missing}"


@pytest.fixture
def site():
    """One of everything the patterns name, and the values for their parameters."""
    registry.register_action(FakeAction(revert=Scripted({"ok": True, "failed": []})))
    registry.register_lease(FakeLease(values={"camp": 5}))
    ended = make_run(status=RunStatus.ABORTED, name="broken raid", cleanup_status="incomplete")
    make_rows(make_step(ended), ["orc-1"], placeholder=False)
    make_lease_row(ended)
    Resource.objects.filter(ref="orc-1").update(state="failed", revert_attempts=3, last_error="503")
    row = Resource.objects.get(ref="orc-1")
    log = RunLog.objects.create(run=ended, kind="cleanup.failed", detail={"error": "503"})
    health = ModuleHealth.objects.create(module="test", backend="north")
    event = ModuleEvent.objects.create(module="test", backend="north", kind="module.down", detail={})
    alert = Alert.objects.create(run=ended, event="cleanup.gave_up", channel="mail", payload={})
    owner = User.objects.create_user("owner", password="pw-123456789")
    token, _key = issue(owner)
    schedule = Schedule.objects.create(func="cleanup.tasks.tick_task", name="tick")
    task = Task.objects.create(
        id="a" * 32, name="t", func="math.floor", started="2026-01-01T00:00Z", stopped="2026-01-01T00:00Z", success=True
    )
    failed = Task.objects.create(
        id="b" * 32,
        name="f",
        func="math.floor",
        started="2026-01-01T00:00Z",
        stopped="2026-01-01T00:00Z",
        success=False,
    )
    queued = OrmQ.objects.create(key="default", payload="x", lock=None)
    ids = {
        ("cleanup", "run"): ended.pk,
        ("cleanup", "resource"): row.pk,
        ("cleanup", "runlog"): log.pk,
        ("cleanup", "step"): ended.steps.first().pk,
        ("cleanup", "modulehealth"): health.pk,
        ("cleanup", "moduleevent"): event.pk,
        ("cleanup", "alert"): alert.pk,
        ("auth", "user"): owner.pk,
        ("auth", "group"): Group.objects.create(name="ops").pk,
        ("knox", "authtoken"): token.pk,
        **axes_rows(),
        ("django_q", "schedule"): schedule.pk,
        ("django_q", "success"): task.pk,
        ("django_q", "failure"): failed.pk,
        ("django_q", "ormq"): queued.pk,
    }
    return {"run": ended, "row": row, "ids": ids}


def axes_rows():
    """One of each of django-axes' records of logins (the lockout's admin pages)."""
    from axes.models import AccessAttempt, AccessFailureLog, AccessLog

    seen = {"user_agent": "ua", "ip_address": "10.0.0.9", "username": "owner", "http_accept": "*/*", "path_info": "/"}
    return {
        ("axes", "accessattempt"): AccessAttempt.objects.create(
            **seen, get_data="", post_data="", failures_since_start=5
        ).pk,
        ("axes", "accessfailurelog"): AccessFailureLog.objects.create(**seen).pk,
        ("axes", "accesslog"): AccessLog.objects.create(**seen).pk,
    }


def concrete(route, page, site):
    """The route with every parameter filled with something that exists."""
    if page[0] == "model":
        object_id = site["ids"][page[1], page[2]]
        path = re.sub(r"<(?:path|int):object_id>|<id>", str(object_id), route)
    else:
        path = route.replace("<path:content_type_id>/<path:object_id>", "1/1")
        path = re.sub(r"\^\(\?P<app_label>[\w|]+\)/\$", "cleanup/", path)
        path = path.replace("(?P<url>.*)$", "no/such/page/")
        if "resources/<int:pk>" in path:
            path = path.replace("<int:pk>", str(site["row"].pk))
        path = path.replace("<int:pk>", str(site["run"].pk))
        path = path.replace("<str:name>", "test").replace("<str:backend>", "north")
    return "/" + path


def login(client, role):
    spec = ROLES[role]
    if spec is None:
        return None
    staff, active, superuser, codenames = spec
    user = User.objects.create_user(role, password="pw-123456789", is_staff=staff, is_superuser=superuser)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="cleanup", codename__in=codenames))
    client.force_login(user)
    if not active:
        User.objects.filter(pk=user.pk).update(is_active=False)
    return user


def expected(role, page, method):
    """``"allowed"`` or ``"refused"`` by the tables."""
    spec = ROLES[role]
    active_staff = spec is not None and spec[0] and spec[1]
    superuser = active_staff and spec[2]
    perms = set(spec[3]) if spec else set()
    method = method.upper()
    if page[0] == "api":
        needs = API[page[1]]
        wanted = needs.get("GET" if method == "HEAD" else method)
        if not active_staff:
            return "refused"
        if method == "OPTIONS":
            return "refused" if page[1] == "api-docs" else "allowed"  # the docs page has GET alone
        if wanted is None:
            return "refused"  # 405
        return "allowed" if superuser or wanted <= perms else "refused"
    if page[0] == "site":
        who, methods = SITE[page[1]]
        if who == NOBODY:
            return "allowed" if method == "OPTIONS" and active_staff else "refused"
        if who == ANY:
            return ANY
        if method not in methods:
            return "refused"
        return "allowed" if who == OPEN or active_staff else "refused"
    _, app, model, kind = page
    if not active_staff:
        return "refused"
    needs = ADMIN_MODELS[app, model]
    may_view = superuser or (needs is not None and needs in perms)
    if app == "cleanup":
        if (model, kind) == ("run", "add"):  # "Start a run…"
            return "allowed" if superuser or "add_run" in perms else "refused"
        if kind == "again":  # "Run again…": the run is read, a new one started
            return "allowed" if superuser or {"view_run", "add_run"} <= perms else "refused"
        if kind == "end":  # "End now…", as the API's cancel
            return "allowed" if superuser or {"view_run", "change_run"} <= perms else "refused"
        if kind == "live":  # a page's fragment, read again: GET alone
            return "allowed" if may_view and method in ("GET", "HEAD") else "refused"
        if kind in ("add", "delete"):
            return "refused"  # nothing else adds, and nothing deletes, our rows here
        if kind == "change" and method == "POST":
            return "refused"  # read-only: no Save
        if kind == "mark_down":
            return "allowed" if superuser or {"view_modulehealth", "cleanup_run"} <= perms else "refused"
        return "allowed" if may_view else "refused"
    if kind == "redirect":
        return "allowed"  # to the object's change page, which checks; shows nothing itself
    if kind == "add" and (app, model) in READ_ONLY | RECORDS:
        return "refused"
    if (app, model) in RECORDS and kind == "change" and method == "POST":
        return "refused"
    if (app, model) in KEPT and kind == "delete":
        return "refused"
    return "allowed" if superuser else "refused"


def outcome(response, page):
    """``"allowed"``, ``"refused"`` or ``"error"`` from an answer."""
    status = response.status_code
    if page == ("site", "healthz") and status == 503:
        return "allowed"  # the probe's own answer: no cluster ticks in a test
    if status >= 500:
        return "error"
    if status in (401, 403, 405):
        return "refused"
    if status in (301, 302) and "/admin/login/" in response.get("Location", "") and page[0] != "site":
        return "refused"
    if status in (301, 302) and "/admin/login/" in response.get("Location", "") and page[1] != "":
        return "refused"
    return "allowed"


def request(client, method, path):
    if method in ("post", "put", "patch"):
        return getattr(client, method)(path, data="{}", content_type="application/json")
    return getattr(client, method)(path)


@pytest.mark.slow  # some 6,000 requests
@pytest.mark.parametrize("role", list(ROLES))
def test_the_access_matrix(role, client, site):
    login(client, role)
    wrong = []
    for route, name in patterns():
        page = page_of(route, name)
        if page is None:
            continue  # test_every_url_pattern_has_a_row_in_the_matrix names it
        path = concrete(route, page, site)
        for method in METHODS:
            if page[0] == "site" and page[1] == "admin/logout/" and method == "post":
                continue  # would end this role's session for the rest of the walk
            response = request(client, method, path)
            got, want = outcome(response, page), expected(role, page, method)
            if got != want and not (want == ANY and got != "error"):
                wrong.append(f"{method.upper()} {path}: {response.status_code}, expected {want}")
    assert not wrong, "\n".join(wrong)
