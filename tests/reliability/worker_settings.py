"""The site's settings, plus the recording module, for the processes the suite starts."""

from eventsite.settings import *  # noqa: F403
from eventsite.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.reliability.recorder"]
