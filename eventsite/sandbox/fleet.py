"""The sandbox's fleet of shards as a setting: ``SANDBOX_SHARDS``, read and checked.

``SANDBOX_SHARDS`` is a comma-separated list of ``name=url`` pairs, such as
``north=http://127.0.0.1:7777,south=http://127.0.0.1:7778``. Each name is the backend's
name in the ledger (``Step.backend``, ``Resource.backend``, module health), so it is kept
short and plain: letters, digits, ``.``, ``_`` and ``-``, at most 100 characters, starting
with a letter or a digit (no ``:``, which separates the shard from the spawner in a lease
target such as ``north:orc-camp``). Each URL is an ``http://`` or ``https://`` address with
a host. Names and URLs are each used once.

When ``SANDBOX_SHARDS`` is empty the site has a fleet of one: the shard at
``SANDBOX_SHARD_URL``, whose backend's name is ``""``, exactly as before there were fleets.

This file uses the standard library only, so that the site's settings can import it.
May import: the standard library only.
"""

import re
from urllib.parse import urlsplit

SHARD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")


class BadShards(ValueError):
    """A ``SANDBOX_SHARDS`` that cannot be used; the message names the bad item."""


def url_problem(url: str) -> str | None:
    """What is wrong with a shard's URL, or None."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is no number)
    except ValueError as exc:
        return f"cannot be read: {exc}"
    if parts.scheme not in ("http", "https"):
        return "is not an http:// or https:// URL"
    if not parts.hostname:
        return "has no host"
    if parts.query or parts.fragment:
        return "may not have a query or a fragment"
    return None


def parse_shards(text: str | None) -> dict[str, str]:
    """``{name: url}`` from ``"north=http://…,south=http://…"``, in the order given.

    An empty text is an empty fleet (the site then uses ``SANDBOX_SHARD_URL``); empty
    items (a trailing comma) are ignored. Raises `BadShards` naming the first bad item.
    """
    shards: dict[str, str] = {}
    by_url: dict[str, str] = {}
    for raw in (text or "").split(","):
        item = raw.strip()
        if not item:
            continue
        name, sep, url = item.partition("=")
        name, url = name.strip(), url.strip().rstrip("/")
        if not sep:
            raise BadShards(f"{item!r} is not a name=url pair")
        if not SHARD_NAME.match(name):
            raise BadShards(
                f"{item!r}: a shard's name is letters, digits, '.', '_' or '-' (at most 100, "
                f"starting with a letter or a digit), not {name!r}"
            )
        if name in shards:
            raise BadShards(f"{item!r}: the shard {name!r} is named twice")
        problem = url_problem(url)
        if problem:
            raise BadShards(f"{item!r}: the URL {url!r} {problem}")
        if url in by_url:
            raise BadShards(f"{item!r}: {url} is already the shard {by_url[url]!r}; one shard has one name")
        shards[name] = url
        by_url[url] = name
    return shards
