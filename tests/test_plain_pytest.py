"""Plain ``pytest`` works from the checkout, as ``python -m pytest`` does (issue 43)."""

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings


def test_plain_pytest_collects_the_suite_from_the_checkout():
    script = Path(sys.executable).parent / "pytest"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE")}

    done = subprocess.run(
        [str(script), "--collect-only", "-q", "-p", "no:cacheprovider", "tests/test_plain_pytest.py"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 test collected" in done.stdout
