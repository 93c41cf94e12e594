"""bin/annotations counts the fully annotated functions of the app the way mypy's strict mode
sees them: every parameter but a method's own, and the return."""

import importlib.machinery
import importlib.util
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
