"""A console's client, generated from the schema by openapi-python-client, works as the API does.

The schema is generated without a warning (a warning is how openapi-python-client says it
skipped a type, an enum or a response), and the generated client, talking to the app
in-process, gets every answer parsed: a run it starts, the plan's `next` as an enum, and
each error as the `Error` envelope with its code as an enum, never ``parsed=None``.
"""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from drf_spectacular.generators import SchemaGenerator

from cleanup import registry
from cleanup.models import Resource, RunStatus
from eventsite.wsgi import application
from tests.fakes import FakeAction, make_rows, make_run, make_step
from tests.test_api_schema import root_token, wsgi_keeps_the_test_connection  # noqa: F401 (fixtures)

pytestmark = pytest.mark.django_db

GENERATOR = Path(sys.executable).parent / "openapi-python-client"
PACKAGE = "eventsite_console_client"


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The client package generated from the schema, importable; the generator's output with it.

    Generated once for the file: the schema is the one /api/schema/ serves (test_api_schema
    checks that the endpoint answers it), made without a request or the database.
    """
    tmp_path = tmp_path_factory.mktemp("console")
    schema = SchemaGenerator().get_schema(request=None, public=True)
    schema = json.loads(json.dumps(schema, default=str))
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    # No post hooks: they run ruff from PATH, and their absence is itself reported as a warning.
    (tmp_path / "config.yaml").write_text("post_hooks: []\n")
    done = subprocess.run(
        [
            str(GENERATOR),
            "generate",
            "--path",
            str(tmp_path / "schema.json"),
            "--config",
            str(tmp_path / "config.yaml"),
            "--meta",
            "none",
            "--output-path",
            str(tmp_path / PACKAGE),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    sys.path.insert(0, str(tmp_path))
    try:
        yield done, lambda name: importlib.import_module(f"{PACKAGE}.{name}")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


@pytest.fixture
def console(generated, root_token, wsgi_keeps_the_test_connection):  # noqa: F811
    _done, module = generated
    client = module("client").AuthenticatedClient(
        base_url="http://testserver",
        token=root_token,
        prefix="Token",
        httpx_args={"transport": httpx.WSGITransport(app=application)},
    )
    return client, module


def test_the_client_generates_without_a_warning(generated):
    done, module = generated
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "warning" not in output.lower(), output
    assert module("models").Error and module("models").ErrorCodeEnum


def test_a_run_started_by_the_client_is_parsed_with_its_enums(console):
    client, module = console
    models = module("models")
    body = models.RunStart.from_dict({"name": "raid", "steps": [{"action": "core.wait", "params": {"seconds": 60}}]})
    answer = module("api.runs.events_runs_create").sync_detailed(client=client, body=body)
    assert answer.status_code == 201, answer.content
    assert isinstance(answer.parsed, models.RunDetail)
    assert answer.parsed.status == models.RunStatusEnum.RUNNING
    assert answer.parsed.steps[0].params.additional_properties == {"seconds": 60}


def test_every_error_the_client_meets_is_parsed_as_the_envelope(console):
    client, module = console
    models = module("models")
    ended = make_run(status=RunStatus.COMPLETED)
    refused = module("api.runs.events_runs_cancel_create").sync_detailed(
        ended.pk, client=client, body=models.Cancel(cleanup=True)
    )
    assert refused.status_code == 409
    assert isinstance(refused.parsed, models.Error) and refused.parsed.code == models.ErrorCodeEnum.RUN_ENDED
    missing = module("api.runs.events_runs_retrieve").sync_detailed(999_999, client=client)
    assert (missing.status_code, missing.parsed.code) == (404, models.ErrorCodeEnum.NOT_FOUND)
    bad = module("api.runs.events_runs_create").sync_detailed(
        client=client, body=models.RunStart.from_dict({"name": "raid", "steps": [{"action": "no.such"}]})
    )
    assert (bad.status_code, bad.parsed.code) == (400, models.ErrorCodeEnum.INVALID)
    assert "steps[0].action" in bad.parsed.errors.additional_properties


def test_the_plan_is_parsed_with_next_and_state_as_enums(console):
    registry.register_action(FakeAction(revert=lambda **kw: {"ok": True, "failed": []}))
    run = make_run(status=RunStatus.ABORTED)
    make_rows(make_step(run), ["orc-1"], placeholder=False)
    client, module = console
    models = module("models")
    plan = module("api.runs.events_runs_cleanup_plan_retrieve").sync_detailed(run.pk, client=client)
    assert plan.status_code == 200, plan.content
    [group] = plan.parsed.groups
    assert group.next_ == models.NextEnum.REVERT
    assert group.rows[0].state == models.ResourceStateEnum(Resource.objects.get().state)
