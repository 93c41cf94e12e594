"""The site's error pages render under any URLconf: no reversal that can fail (issue 43)."""

from django.template.loader import render_to_string
from django.test import override_settings

# A URLconf without the admin, as a studio's project may have.
urlpatterns: list = []


@override_settings(ROOT_URLCONF=__name__)
def test_the_500_and_404_pages_render_under_a_urlconf_without_the_admin():
    for template, heading in (("500.html", "The server could not answer this page"), ("404.html", "Page not found")):
        html = render_to_string(template)
        assert heading in html
        assert "Back to the admin's index" not in html and 'href="/admin/"' not in html, "a link to no admin"


def test_the_error_pages_lead_back_to_the_admins_index_where_there_is_one():
    html = render_to_string("500.html")
    assert 'href="/admin/"' in html and "Back to the admin's index" in html
