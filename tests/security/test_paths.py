"""No 500 from a path: a NUL or another control character in any segment of any URL
pattern answers 404, to anyone; so do bytes that are not UTF-8. A path fuzzer over every
pattern of the site (the admin's, django-q2's, the API's, the docs'), as a superuser, as
staff without permissions and anonymously."""

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import URLResolver, get_resolver

from cleanup.security import path_problem

pytestmark = pytest.mark.django_db

# Percent-encoded, as a client sends them: NUL, a C0 control, DEL, a C1 control (U+0085).
CONTROL = ["%00", "%0A", "%7F", "a%C2%85"]
# Not a control character, but not UTF-8 either (Django keeps them percent-encoded).
BROKEN = ["%FF", "%ED%A0%80", "%C0%80"]
PARAMETER = re.compile(r"<[^>]+>|\(\?P<\w+>[^)]*\)")


def patterns(resolver=None, prefix=""):
    """Every URL pattern of the site, as a path template: parameters left as ``{}``."""
    resolver = resolver or get_resolver()
    for entry in resolver.url_patterns:
        text = prefix + re.sub(r"^\^|\$$|\\Z$", "", str(entry.pattern))
        if isinstance(entry, URLResolver):
            yield from patterns(entry, text)
        else:
            yield PARAMETER.sub("{}", text).replace("\\", "")


def bad_paths(segment):
    """``segment`` in each parameter of each pattern, or as an extra segment of one without."""
    paths = set()
    for template in patterns():
        if "{}" in template:
            paths.add("/" + template.replace("{}", segment))
            # The other parameters well-formed, this one bad.
            paths.add("/" + template.replace("{}", "1", template.count("{}") - 1).replace("{}", segment))
        else:
            paths.add("/" + template + segment + "/")
    return sorted(paths)


def test_the_fuzzer_reaches_every_door():
    every = list(patterns())
    assert len(every) > 100  # the admin's pages, django-q2's, the API's
    for expected in ("api/events/modules/{}/log/", "admin/django_q/success/{}/change/", "api/docs/", "healthz"):
        assert expected in every, expected


def clients():
    root = User.objects.create_superuser("root", password="pw-123456789")
    staff = User.objects.create_user("clerk", password="pw-123456789", is_staff=True)
    signed = {}
    for name, user in (("superuser", root), ("staff", staff)):
        signed[name] = Client()
        signed[name].force_login(user)
    signed["anonymous"] = Client()
    return signed


@pytest.mark.parametrize("segment", CONTROL)
def test_a_control_character_in_any_segment_is_a_404(segment):
    wrong = []
    for who, client in clients().items():
        for path in bad_paths(segment):
            # A POST is refused as early as a GET (before the CSRF check), so one is enough.
            for method in ("get", "post") if who == "superuser" and segment == "%00" else ("get",):
                status = getattr(client, method)(path).status_code
                if status != 404:
                    wrong.append((who, method, path, status))
    assert wrong == []


@pytest.mark.slow
def test_bytes_that_are_not_utf8_never_answer_500():
    wrong = []
    for who, client in clients().items():
        for segment in BROKEN if who == "superuser" else BROKEN[:1]:
            for path in bad_paths(segment):
                status = client.get(path).status_code
                if status >= 500:
                    wrong.append((who, path, status))
    assert wrong == []


def test_under_the_api_the_404_is_json():
    answer = Client().get("/api/events/modules/%00/log/")
    assert answer.status_code == 404 and answer["Content-Type"].startswith("application/json")


def test_the_path_check_knows_a_control_character_from_text():
    assert path_problem("/api/events/modules/\x00/log/") and path_problem("/x\x85/") and path_problem("/\ud800/")
    assert not path_problem("/api/events/modules/sandbox/log/") and not path_problem("/admin/é/")
