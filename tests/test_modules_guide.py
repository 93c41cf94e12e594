"""The guide's "write your first module" walk-through gives a module that passes the kit.

The test writes the files the guide shows (each code block after a ``<!-- file: PATH -->``
line) into a directory outside the repository, installs the package by ``EVENT_MODULES``
alone, and runs ``check_module`` on it against a real shard, as the guide says.
"""

import os
import re
import subprocess
import sys

from django.conf import settings

from tests.shard import shard_process  # noqa: F401  (a pytest fixture)

GUIDE = settings.BASE_DIR / "docs" / "modules.md"
FILE_BLOCK = re.compile(r"<!-- file: (?P<path>\S+) -->\n```python\n(?P<code>.*?)```", re.DOTALL)
PARAMS = '{"creature": "orc", "count": 3, "at": "north-gate"}'


def write_walkthrough(root):
    blocks = list(FILE_BLOCK.finditer(GUIDE.read_text()))
    for block in blocks:
        path = root / block["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(block["code"])
    return [b["path"] for b in blocks]


def test_the_walkthrough_module_passes_the_kit(shard_process, tmp_path):  # noqa: F811
    packages = tmp_path / "packages"
    assert write_walkthrough(packages) == ["horde/apps.py", "horde/module.py"]
    env = {
        **os.environ,
        "DEBUG": "1",
        "EVENTSITE_VAR_DIR": str(tmp_path),
        "PYTHONPATH": str(packages),
        "EVENT_MODULES": "horde",
        "HORDE_URL": shard_process.url,
    }
    env.pop("DATABASE_URL", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)

    result = subprocess.run(
        [sys.executable, str(settings.BASE_DIR / "manage.py"), "check_module", "horde.summon", "--params", PARAMS],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "action horde.summon: all 31 checks passed"
    assert "`action horde.summon: all 31 checks passed`" in GUIDE.read_text()
