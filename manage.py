#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "eventsite.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # A missing or unreadable setting (SECRET_KEY, DATABASE_URL): say which, no traceback.
        sys.stderr.write(f"{os.path.basename(sys.argv[0])}: {exc}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
