"""The arrows between the app's parts run one way (docs/architecture.md).

Read from the source, every import counted, those inside functions too: no import circle
anywhere in `cleanup/`, the engine never imports a surface, the models never import the
engine, a module sees only the registry, and nothing in the reusable app names the
example site. The page's table of parts names every module of the app.
"""

import ast
import re
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent / "cleanup"
ARCHITECTURE = APP.parent / "docs" / "architecture.md"

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


# The packages people and consoles use. Every other module of the app is engine (or the
# kit), and imports none of them, whether or not it is listed in ENGINE above.
PEOPLE_SURFACES = ("cleanup.admin", "cleanup.api", "cleanup.management", "cleanup.templatetags")
# What wires the surfaces in: the app's start-up (`apps`) and the URLs a project includes.
WIRING = ("cleanup.apps", "cleanup.urls")


def surface_imports(graph):
    """``{(engine module, surface module)}``: every import of a surface by a module that is not one."""
    return {
        (name, target)
        for name, targets in graph.items()
        if not under(name, PEOPLE_SURFACES + WIRING)
        for target in targets
        if under(target, PEOPLE_SURFACES)
    }


def test_no_module_but_the_surfaces_imports_a_surface(graph):
    assert surface_imports(graph) == set()


def test_an_engine_module_importing_a_surface_is_caught():
    graph = {
        "cleanup.retention": {"cleanup.api.pages"},
        "cleanup.api.views": {"cleanup.runner"},
        "cleanup.apps": {"cleanup.api"},
    }
    assert surface_imports(graph) == {("cleanup.retention", "cleanup.api.pages")}


def parts_table():
    """The names in the first column of the table under "The parts"."""
    section = ARCHITECTURE.read_text().split("## The parts", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


def table_name(name):
    """A module's name as the table writes it: ``sweep/claims``, ``sweep/`` for a package."""
    path = sources()[name]
    relative = path.relative_to(APP).with_suffix("")
    return f"{relative.parent.as_posix()}/" if path.name == "__init__.py" else relative.as_posix()


def unnamed_in_table(names, table):
    """The modules ``table`` does not name, itself or as a package listed on one line (``admin/``:
    a package none of whose modules has a line of its own)."""
    one_line = {n for n in table if n.endswith("/") and not any(t != n and t.startswith(n) for t in table)}
    return sorted(
        name
        for name in names
        if table_name(name) not in table and not any(table_name(name).startswith(package) for package in one_line)
    )


def test_the_table_of_parts_names_every_module_of_the_app():
    # `cleanup` itself is the app the table is about.
    assert unnamed_in_table([n for n in sources() if n != "cleanup"], parts_table()) == []


def test_the_table_reader_sees_a_module_left_out():
    table = parts_table()
    assert {"models", "sweep/", "sweep/claims", "admin/", "testing/"} <= table
    assert unnamed_in_table(["cleanup.metrics", "cleanup.admin.lists", "cleanup.sweep.claims"], table) == []
    assert unnamed_in_table(["cleanup.metrics", "cleanup.sweep.claims"], table - {"metrics", "sweep/claims"}) == [
        "cleanup.metrics",
        "cleanup.sweep.claims",
    ]
    # `sweep/` has lines for its modules, so it does not stand for them.
    assert unnamed_in_table(["cleanup.sweep.claims"], table - {"sweep/claims"}) == ["cleanup.sweep.claims"]


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
