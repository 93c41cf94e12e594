"""The arrows between the app's parts run one way (docs/architecture.md).

Read from the source, every import counted, those inside functions too: no import circle
anywhere in `cleanup/`, the engine never imports a surface, the models never import the
engine, a module sees only the registry, and nothing in the reusable app names the
example site.
"""

import ast
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent / "cleanup"

# The surfaces: they call the engine, never the other way round.
SURFACES = ("cleanup.admin", "cleanup.api", "cleanup.management", "cleanup.templatetags", "cleanup.tasks")
# What the pass may not reach up to: the people's and the runner's code call it.
ABOVE_THE_PASS = ("cleanup.manual", "cleanup.runner", "cleanup.reconcile", "cleanup.plan", "cleanup.alerts")
ENGINE = (
    "cleanup.sweep",
    "cleanup.outages",
    "cleanup.calls",
    "cleanup.ledger",
    "cleanup.runner",
    "cleanup.reconcile",
    "cleanup.manual",
    "cleanup.plan",
    "cleanup.timeline",
    "cleanup.alerts",
    "cleanup.feed",
    "cleanup.validation",
    "cleanup.registry",
    "cleanup.enqueue",
    "cleanup.models",
    "cleanup.conf",
)


def module_name(path):
    parts = list(path.relative_to(APP.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources():
    return {
        module_name(path): path
        for path in sorted(APP.rglob("*.py"))
        if "migrations" not in path.parts and "__pycache__" not in path.parts
    }


def imports_of(name, path, known):
    """The modules of the app that ``name`` imports, anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from x import y` imports x, and x.y when y is a module of its own.
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            # A package is imported before each of its modules anyway: a module that
            # names its own package (`from . import statements`) adds no arrow.
            if target and target != name and not name.startswith(target + "."):
                found.add(target)
    return found


@pytest.fixture(scope="module")
def graph():
    known = sources()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def under(name, prefixes):
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_graph_is_read_from_the_source(graph):
    # A reader that found nothing would pass every check below.
    assert "cleanup.sweep.claims" in graph["cleanup.sweep"]
    assert "cleanup.sweep" in graph["cleanup.manual"]
    assert "cleanup.models" in graph["cleanup.sweep.verdicts"]


def test_it_has_no_import_circle(graph):
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_engine_never_imports_a_surface(graph):
    wrong = {name: sorted(t for t in targets if under(t, SURFACES)) for name, targets in graph.items()}
    assert {name: t for name, t in wrong.items() if t and under(name, ENGINE)} == {}


def test_the_pass_never_reaches_up_to_its_callers(graph):
    wrong = {
        name: sorted(t for t in targets if under(t, ABOVE_THE_PASS + SURFACES))
        for name, targets in graph.items()
        if under(name, ("cleanup.sweep",))
    }
    assert {name: t for name, t in wrong.items() if t} == {}


def test_the_models_and_settings_import_no_engine(graph):
    assert graph["cleanup.conf"] == set()
    assert graph["cleanup.models"] <= {"cleanup.conf"}


def test_the_registry_and_enqueue_stand_alone(graph):
    # A module imports `cleanup.registry`: it must not drag the engine in with it.
    assert graph["cleanup.enqueue"] == set()
    assert graph["cleanup.registry"] <= {"cleanup.enqueue", "cleanup.envelopes"}


def test_nothing_in_the_app_names_the_example_site():
    named = [
        str(path.relative_to(APP.parent))
        for path in APP.rglob("*")
        if path.is_file()
        and path.suffix in (".py", ".html", ".txt", ".md")
        and "eventsite" in path.read_text(errors="replace")
    ]
    assert named == []


def test_every_module_says_what_it_is_for_and_what_it_may_import():
    silent = []
    for name, path in sources().items():
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if "may import" not in doc.lower():
            silent.append(name)
    assert silent == []


def test_a_process_that_only_sweeps_loads_no_schema_machinery():
    """A sweeper or a cluster worker sets Django up and runs the engine: drf-spectacular's
    schema machinery (which pulls in requests, yaml, jinja2, ~20 MB) is the API's alone."""
    import subprocess
    import sys

    code = (
        "import django, sys; django.setup(); import cleanup.sweep, cleanup.tasks, cleanup.runner, cleanup.metrics; "
        "from django.contrib import admin; admin.autodiscover(); "
        "print(sorted(m for m in ('drf_spectacular.plumbing', 'drf_spectacular.extensions', 'requests', 'yaml') "
        "if m in sys.modules))"
    )
    env = {"DJANGO_SETTINGS_MODULE": "eventsite.settings", "DEBUG": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=APP.parent, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
