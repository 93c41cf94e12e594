"""The rules of docs/architecture.md are kept by code that says so, and checked by tests that exist.

Each rule names the tests that check it: every one of them must exist (its file, and its
function when one is named). Each rule is cited ("rule N", "rules N and M") at least once
in a comment or a docstring of the code under `cleanup/` that keeps it, so a reader of the
code finds the promise, and a reader of the rule finds the code.
"""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
APP = ROOT / "cleanup"

RULE_HEADING = re.compile(r'<a id="rule-(?P<anchor>\d+)"></a>\n### (?P<number>\d+)\. ')
# `tests/test_x.py`, `tests/test_x.py::test_y`, `tests/test_x.py::Class::test_y[param-id]`
NAMED_TEST = re.compile(r"`(?P<path>tests/[\w/]+\.py)(?:::(?P<name>[\w:]+)(?:\[[^\]`]*\])?)?`")
# "rule 13", "Rules 10 and 14", "rules 9, 18 and 27"
CITATION = re.compile(r"\brules?\s+(?P<numbers>\d+(?:(?:\s*,\s*(?:and\s+)?|\s+and\s+)\d+)*)", re.IGNORECASE)


def rules():
    """``{number: text}``: each rule's section of the page, its heading to the next."""
    text = ARCHITECTURE.read_text()
    headings = list(RULE_HEADING.finditer(text))
    found = {}
    for heading, following in zip(headings, [*headings[1:], None], strict=True):
        end = following.start() if following else text.index("\n## ", heading.end())
        found[int(heading["number"])] = text[heading.start() : end]
    return found


def named_tests(text):
    return [(m["path"], m["name"]) for m in NAMED_TEST.finditer(text)]


def functions_in(path):
    """The test names a file defines: ``test_x`` and ``Class::test_x``."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(
                f"{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            )
    return names


def missing_tests(text):
    missing = []
    for path, name in named_tests(text):
        file = ROOT / path
        if not file.is_file():
            missing.append(path)
        elif name and name not in functions_in(file):
            missing.append(f"{path}::{name}")
    return missing


def commentary(source):
    """The comments and the docstrings of a Python source, each as one line of text."""
    parts = []
    block = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            block.append(token.string.lstrip("#").strip())
        elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            if block:
                parts.append(" ".join(block))
                block = []
    if block:
        parts.append(" ".join(block))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if doc:
                parts.append(" ".join(doc.split()))
    return parts


def cited_in(text):
    return {int(n) for m in CITATION.finditer(text) for n in re.findall(r"\d+", m["numbers"])}


def citations():
    """``{rule number: [module paths that cite it]}`` over every module of `cleanup/` but migrations."""
    found = {}
    for path in sorted(APP.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for number in cited_in("\n".join(commentary(path.read_text()))):
            found.setdefault(number, []).append(str(path.relative_to(ROOT)))
    return found


def test_the_rules_are_numbered_one_to_the_last_in_order():
    numbers = list(rules())
    assert numbers == list(range(1, len(numbers) + 1))
    assert len(numbers) >= 33


def test_every_rule_names_the_tests_that_check_it():
    assert [n for n, text in rules().items() if not named_tests(text)] == []


@pytest.mark.parametrize("number", sorted(rules()))
def test_every_test_a_rule_names_exists(number):
    assert missing_tests(rules()[number]) == []


def test_every_test_the_page_names_elsewhere_exists():
    # "What holds whatever kills the workers" names tests and whole files too.
    assert missing_tests(ARCHITECTURE.read_text()) == []


def test_every_rule_is_cited_by_the_code_that_keeps_it():
    cited = citations()
    assert [n for n in rules() if n not in cited] == []


def test_no_code_cites_a_rule_that_does_not_exist():
    known = set(rules())
    assert {n: paths for n, paths in citations().items() if n not in known} == {}


def test_the_readers_find_what_they_look_for():
    # The checks above read nothing if these do not: a test of their readers.
    assert cited_in("the newest lease restores (rule 13); rules 10 and 14; Rules 9, 18, and 27") == {
        9,
        10,
        13,
        14,
        18,
        27,
    }
    assert commentary('"""Keeps rule 4."""\n# rule\n# 5 spans two lines\nx = "rule 6"  # rule 7\n') == [
        "rule 5 spans two lines",
        "rule 7",
        "Keeps rule 4.",
    ]
    assert named_tests(
        "- `tests/test_a.py::test_b[x-1]`, `tests/reliability/test_c.py`, `tests/test_d.py::K::test_e`"
    ) == [
        ("tests/test_a.py", "test_b"),
        ("tests/reliability/test_c.py", None),
        ("tests/test_d.py", "K::test_e"),
    ]
    assert missing_tests("`tests/test_rules.py::test_there_is_no_such_test` `tests/test_rules.py::rules`") == [
        "tests/test_rules.py::test_there_is_no_such_test"
    ]
