"""The site's URLs and two views that fail, for the error mail tests."""

from django.urls import path

from eventsite.urls import urlpatterns as site


def boom(request):
    raise RuntimeError("the first thing that breaks")


def other_boom(request):
    raise KeyError("another thing that breaks")


urlpatterns = [path("boom/", boom), path("other-boom/", other_boom), *site]
