"""bin/annotations counts the fully annotated functions of the app the way mypy's strict mode
sees them: every parameter but a method's own, and the return."""

import importlib.machinery
import importlib.util
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script():
    loader = importlib.machinery.SourceFileLoader("annotations_script", str(ROOT / "bin" / "annotations"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


SAMPLE = """
def typed(a: int, *rest: str, key: bool = False, **more: object) -> None: ...
def no_return(a: int): ...
def bare_param(a, b: int) -> int: ...
async def typed_async() -> None: ...

class Thing:
    def method(self, a: int) -> int:
        def inner(b): ...
        return a
    @staticmethod
    def static(a) -> None: ...
    @classmethod
    def build(cls) -> "Thing": ...
    def __init__(self, a: int): ...
    def __repr__(self): ...
"""


def test_a_function_counts_only_with_every_parameter_and_its_return_annotated():
    # typed, typed_async, method, build, __init__: 5 of 10 (inner, static, __repr__,
    # no_return, bare_param are not).
    assert _script().count(SAMPLE) == (5, 10)


def test_migrations_are_left_out_of_the_app_s_functions():
    paths = _script().sources(ROOT)
    assert paths, "no source found under cleanup/"
    assert not [p for p in paths if "migrations" in p.parts]
    assert ROOT / "cleanup" / "conf.py" in paths


# The share of the app's functions fully annotated: it may grow, never fall back.
SHARE_FLOOR = 0.82


def _still_untyped():
    """The modules whose untyped functions mypy lets typed code call (`untyped_calls_exclude`)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    return [name for name in config["untyped_calls_exclude"] if name.startswith("cleanup")]


def _module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_module_of_the_app_is_fully_annotated_but_those_still_allowed_untyped_calls():
    script = _script()
    untyped = _still_untyped()
    short = []
    for path in script.sources(ROOT):
        name = _module_name(path)
        if any(name == u or name.startswith(u + ".") for u in untyped):
            continue
        annotated, total = script.count(path.read_text())
        if annotated < total:
            short.append(f"{name}: {annotated} of {total}")
    assert not short, f"not fully annotated, and not in untyped_calls_exclude: {short}"


def test_the_share_of_annotated_functions_does_not_fall():
    script = _script()
    counts = [script.count(path.read_text()) for path in script.sources(ROOT)]
    annotated, total = sum(a for a, _ in counts), sum(t for _, t in counts)
    assert annotated / total >= SHARE_FLOOR, f"{annotated} of {total} functions annotated"
