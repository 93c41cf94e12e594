"""Installing the mod into a world: ``worldmods/eventsite`` and ``load_mod_eventsite = true``.

Idempotent: installing twice changes nothing the second time; a newer copy of the mod
replaces an older one. A world directory that does not exist, a ``world.mt`` that cannot be
read, or a ``worldmods/eventsite`` that is some other mod are refused with the reason.
May import: the standard library only.
"""

import filecmp
import shutil
import tempfile
from pathlib import Path

MOD_NAME = "eventsite"
SOURCE = Path(__file__).resolve().parent / "mod"
ENABLE = f"load_mod_{MOD_NAME}"


class InstallError(Exception):
    """The mod cannot be installed into this world; the message says why."""


def _same_tree(a: Path, b: Path) -> bool:
    compared = filecmp.dircmp(a, b)
    if compared.left_only or compared.right_only or compared.diff_files or compared.funny_files:
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, compared.common_files, shallow=False)
    return not mismatch and not errors and all(_same_tree(a / d, b / d) for d in compared.common_dirs)


def _mod_name(directory: Path) -> str | None:
    try:
        for line in (directory / "mod.conf").read_text().splitlines():
            name, sep, value = line.partition("=")
            if sep and name.strip() == "name":
                return value.strip()
    except OSError:
        return None
    return None


def install(world_dir: str | Path, gameid: str = "minetest") -> list[str]:
    """Install the mod into ``world_dir``; answers what was changed (empty: nothing to do)."""
    world = Path(world_dir)
    if not world.exists():
        raise InstallError(f"{world} does not exist: create the world first (start the server once), or mkdir it")
    if not world.is_dir():
        raise InstallError(f"{world} is not a directory")
    changed = []
    target = world / "worldmods" / MOD_NAME
    if target.exists():
        if not target.is_dir() or _mod_name(target) != MOD_NAME:
            raise InstallError(f"{target} is already there and is not the {MOD_NAME} mod: move it away first")
    if not (target.exists() and _same_tree(SOURCE, target)):
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{MOD_NAME}-", dir=target.parent))
        try:
            shutil.copytree(SOURCE, staging / MOD_NAME, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            if target.exists():
                shutil.rmtree(target)
            (staging / MOD_NAME).rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        changed.append(f"copied the mod to {target}")
    changed += _enable(world / "world.mt", gameid)
    return changed


def _enable(world_mt: Path, gameid: str) -> list[str]:
    try:
        text = world_mt.read_text() if world_mt.exists() else ""
    except OSError as exc:
        raise InstallError(f"cannot read {world_mt}: {exc}") from None
    lines = text.splitlines()
    settings = {}
    for i, line in enumerate(lines):
        name, sep, value = line.partition("=")
        if sep:
            settings[name.strip()] = (i, value.strip())
    changed = []
    if "gameid" not in settings:
        lines.insert(0, f"gameid = {gameid}")
        changed.append(f"set gameid = {gameid} in {world_mt}")
        settings = {k: (i + 1, v) for k, (i, v) in settings.items()}
    if ENABLE in settings:
        i, value = settings[ENABLE]
        if value != "true":
            lines[i] = f"{ENABLE} = true"
            changed.append(f"enabled the mod in {world_mt} (it was {ENABLE} = {value})")
    else:
        lines.append(f"{ENABLE} = true")
        changed.append(f"enabled the mod in {world_mt}")
    if changed:
        try:
            world_mt.write_text("\n".join(lines) + "\n")
        except OSError as exc:
            raise InstallError(f"cannot write {world_mt}: {exc}") from None
    return changed
