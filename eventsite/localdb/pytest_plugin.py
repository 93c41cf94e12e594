"""The test session's database (`-p eventsite.localdb.pytest_plugin`, in pyproject.toml's addopts).

Before pytest-django reads the settings: ``DATABASE_URL`` when set, else the local
PostgreSQL when it answers, else the embedded PostgreSQL, started here and stopped when
the session ends, Ctrl-C included (`eventsite.localdb`). The first line printed says which.
The processes the tests start inherit ``DATABASE_URL`` and so reach the same server.
"""

import contextlib

import pytest

from eventsite import localdb

_session = pytest.StashKey[contextlib.ExitStack]()


@pytest.hookimpl(tryfirst=True)  # before pytest-django loads the settings, which read DATABASE_URL
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    if {"-h", "--help", "--version", "-V"}.intersection(args):
        return
    capture = early_config.pluginmanager.getplugin("capturemanager")

    def say(line: str) -> None:
        # pytest captures what is printed while it loads; this goes to the terminal, first.
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            print(line, flush=True)

    stack = contextlib.ExitStack()
    early_config.stash[_session] = stack
    stack.enter_context(localdb.database(say=say))


def pytest_unconfigure(config: pytest.Config) -> None:
    stack = config.stash.get(_session, None)
    if stack is not None:
        stack.close()
