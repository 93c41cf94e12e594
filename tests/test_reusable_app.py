"""The app installs into another Django project: built as a wheel, included under its own prefix.

A minimal studio back office is written to a temporary directory: its own settings and
urls (its database a scratch one on the test server), one module of its own, and the
`cleanup` app installed from a wheel built from this repository (into a directory of its
own, ahead of everything else on the path). Nothing of the example site may be imported
there: an import hook refuses it. The project migrates, serves the admin's run and ledger
pages, answers the API under its own prefix, and gives a run back through a sweep.
"""

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import dj_database_url
import pytest

from tests.databases import scratch_database  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow

SETTINGS = '''
import json
import os
import sys
from pathlib import Path


class RefuseTheExampleSite:
    """Nothing of the example site may be imported by the app."""

    def find_spec(self, name, path=None, target=None):
        if name == "eventsite" or name.startswith("eventsite."):
            raise ImportError(f"the app imported {name}, a part of the example site")
        return None


sys.meta_path.insert(0, RefuseTheExampleSite())

BASE = Path(__file__).resolve().parent
SECRET_KEY = "studio-test-key"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "knox",
    "django_q",
    "cleanup",
    "backoffice",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "studio_urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {"default": {"ENGINE": "django.db.backends.postgresql", **json.loads(os.environ["STUDIO_DATABASE"])}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
STATIC_URL = "static/"
USE_TZ = True
Q_CLUSTER = {"name": "studio", "orm": "default", "sync": True, "timeout": 60, "retry": 120}
EVENT_REVERT_BACKOFF_S = 0
'''

URLS = """
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("backoffice/admin/", admin.site.urls),
    path("backoffice/events/", include("cleanup.urls")),
]
"""

MODULE = '''
"""The studio's own module: creatures in a dictionary, given back on revert."""

from django.apps import AppConfig

from cleanup import registry

WORLD = {}


class Summon(registry.Action):
    id = "backoffice.summon"
    module = "backoffice"

    def perform(self, *, run_id, step_id, params, idempotency_key):
        refs = [f"{idempotency_key}-{i}" for i in range(params.get("count", 1))]
        for ref in refs:
            WORLD[ref] = params.get("kind", "imp")
        return {"ok": True, "resources": [{"kind": "creature", "ref": ref} for ref in refs]}

    def revert(self, *, run_id, resources, idempotency_key):
        for resource in resources:
            WORLD.pop(resource["ref"], None)
        return {"ok": True, "failed": []}


class BackofficeConfig(AppConfig):
    name = "backoffice"

    def ready(self):
        registry.register_action(Summon())
'''

STORY = """
import json

from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

call_command("migrate", verbosity=0)
User.objects.create_superuser("ops", "ops@studio.example", "pw")
client = Client()
assert client.login(username="ops", password="pw")

started = client.post(
    "/backoffice/events/runs/",
    data=json.dumps(
        {
            "name": "imp swarm",
            "steps": [
                {"action": "backoffice.summon", "params": {"count": 3}},
                {"action": "core.wait", "params": {"seconds": 3600}},
            ],
        }
    ),
    content_type="application/json",
)
assert started.status_code == 201, (started.status_code, started.content)
run_id = started.json()["id"]

from cleanup import runner
from cleanup.sweep import sweep
from backoffice.apps import WORLD

runner.tick(by="studio test")  # the sync cluster ran one at the start already
assert len(WORLD) == 3, WORLD
cancelled = client.post(
    f"/backoffice/events/runs/{run_id}/cancel/", data=json.dumps({"cleanup": True}), content_type="application/json"
)
assert cancelled.status_code == 200, (cancelled.status_code, cancelled.content)
sweep(by="studio test")  # the cancel queued the cleanup, which the sync cluster ran
assert WORLD == {}, WORLD

run = client.get(f"/backoffice/events/runs/{run_id}/")
assert run.status_code == 200 and run.json()["cleanup_status"] == "complete", run.content
rows = client.get(f"/backoffice/events/runs/{run_id}/resources/")
assert rows.status_code == 200, rows.content

index = client.get("/backoffice/admin/")
assert index.status_code == 200 and b"Needs attention" in index.content, index.content[:500]
page = client.get(f"/backoffice/admin/cleanup/run/{run_id}/change/")
assert page.status_code == 200 and b"imp swarm" in page.content, page.status_code
ledger = client.get("/backoffice/admin/cleanup/resource/")
assert ledger.status_code == 200 and b"backoffice" in ledger.content, ledger.status_code

import cleanup, sys
print("CLEANUP_FROM", cleanup.__file__)
assert "eventsite" not in sys.modules
print("STORY OK")
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (path,) = out.glob("*.whl")
    return path


def test_the_wheel_carries_the_apps_templates_static_files_and_migrations(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert "cleanup/templates/admin/cleanup/run/change_form.html" in names
    assert "cleanup/templates/admin/cleanup/index.html" in names
    assert any(n.startswith("cleanup/migrations/0001_") for n in names)
    assert "cleanup/migrations/__init__.py" in names
    static = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "cleanup" / "static").rglob("*") if p.is_file())
    assert [s for s in static if s not in names] == []


def test_a_studio_project_installs_the_app_from_the_wheel_and_gives_a_run_back(
    wheel,
    tmp_path,
    scratch_database,  # noqa: F811
):
    site = tmp_path / "site-packages"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr
    project = tmp_path / "studio"
    (project / "backoffice").mkdir(parents=True)
    (project / "studio_settings.py").write_text(textwrap.dedent(SETTINGS))
    (project / "studio_urls.py").write_text(textwrap.dedent(URLS))
    (project / "backoffice" / "__init__.py").write_text("")
    (project / "backoffice" / "apps.py").write_text(textwrap.dedent(MODULE))
    (project / "story.py").write_text(
        "import django, os\nos.environ['DJANGO_SETTINGS_MODULE'] = 'studio_settings'\ndjango.setup()\n"
        + textwrap.dedent(STORY)
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "DATABASE_URL", "EVENT_", "Q_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(project)])
    parts = dj_database_url.parse(scratch_database)
    env["STUDIO_DATABASE"] = json.dumps({key: parts[key] for key in ("NAME", "USER", "PASSWORD", "HOST", "PORT")})
    ran = subprocess.run(
        [sys.executable, "story.py"], cwd=project, env=env, capture_output=True, text=True, timeout=300
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "STORY OK" in ran.stdout
    assert f"CLEANUP_FROM {site}" in ran.stdout
