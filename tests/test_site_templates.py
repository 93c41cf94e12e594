"""The site's own templates live in the top-level templates/ folder: the admin's branding,
the login page, and 404/500 pages in the admin's look; the reusable app keeps its own."""

from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.test import RequestFactory, override_settings
from django.views import defaults

pytestmark = pytest.mark.django_db

SITE_TEMPLATES = Path(settings.BASE_DIR) / "templates"


def test_the_site_names_its_templates_folder_and_the_app_keeps_its_own():
    assert settings.TEMPLATES[0]["DIRS"] == [SITE_TEMPLATES]
    assert (SITE_TEMPLATES / "admin" / "base_site.html").exists()
    app_templates = Path(settings.BASE_DIR) / "cleanup" / "templates"
    assert (app_templates / "admin" / "cleanup" / "run" / "change_form.html").exists()
    assert not list(app_templates.rglob("404.html")) and not list(app_templates.rglob("base_site.html"))


def test_the_admin_and_its_login_carry_the_sites_branding(client):
    login = client.get("/admin/login/")
    assert login.status_code == 200
    text = login.content.decode()
    assert "Eventsite staff" in text and "Django administration" not in text
    assert "log in with your own account" in text
    assert 'name="password"' in text, "the admin's own login form is still there"
    User.objects.create_user("ann", password="pw-ann-1234", is_staff=True)
    client.login(username="ann", password="pw-ann-1234")
    index = client.get("/admin/").content.decode()
    assert "<title>Site administration | Eventsite staff</title>" in index


@override_settings(DEBUG=False)
def test_a_missing_page_is_the_sites_404_in_the_admins_look(client):
    User.objects.create_user("ann", password="pw-ann-1234", is_staff=True)
    client.login(username="ann", password="pw-ann-1234")
    response = client.get("/nothing-here/")
    assert response.status_code == 404
    text = response.content.decode()
    assert "Page not found" in text and "Eventsite staff" in text
    assert "admin/css/base.css" in text and 'href="/admin/"' in text
    assert "Traceback" not in text and "Using the URLconf" not in text


@override_settings(DEBUG=False)
def test_a_server_error_is_the_sites_500_in_the_admins_look():
    # As Django renders it: no request context, no context processor.
    response = defaults.server_error(RequestFactory().get("/admin/"))
    assert response.status_code == 500
    text = response.content.decode()
    assert "The server could not answer this page" in text and "Eventsite staff" in text
    assert "admin/css/base.css" in text and 'href="/admin/"' in text
