"""Identifiers shown whole: a ref, a boot id, a key.

An id's start is often shared (a Luanti world's refs all begin with its name), so it is
never cut at its end. It is shown whole, up to ``LONGEST`` characters (past it, its middle
gives way to an ellipsis, keeping the start and the end that tell rows apart), and where
it wraps it wraps only after its own separators (``world-north:`` / ``mobs_animal:wolf:`` /
``…-000000000007``), never inside a part; its last part and the copy button beside it stay
on one line (`cleanup/static/cleanup/admin.css`), so the end that tells rows apart reads
beside the button that copies the whole (`cleanup/static/cleanup/copy.js`). The whole is
on hover too.
May import Django alone; the admin's pages import it.
"""

import re

from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

LONGEST = 120
# A part ends after one of these: where an id may wrap.
SEPARATED = re.compile(r"[^:/#@\-]*[:/#@\-]+|[^:/#@\-]+")


def middle_cut(value: str, width: int = LONGEST) -> str:
    """``value`` whole when it fits ``width``, else its start and end around an ellipsis."""
    if len(value) <= width:
        return value
    tail = (width - 1) // 2 + 1
    head = width - 1 - tail
    return f"{value[:head]}…{value[-tail:]}"


def parts(value: str) -> list[str]:
    """``value`` in the parts it may wrap between, each ending with its separators."""
    return SEPARATED.findall(value) or [value]


def breakable(value: str) -> SafeString:
    """``value`` escaped, with a wrap opportunity (``<wbr>``) after each separator alone."""
    return mark_safe("<wbr>".join(escape(part) for part in parts(value)))  # each part escaped


def whole_id(value: str, width: int = LONGEST, href: str = "") -> SafeString:
    """An identifier as a page shows it: whole (cut in the middle past ``width``), wrapping
    after its separators alone, whole on hover, with a copy button kept beside its last
    part; with ``href``, the identifier links there (the button stays outside the link)."""
    shown = format_html('<span class="ident" title="{}">{}</span>', value, breakable(middle_cut(value, width)))
    if href:
        shown = format_html('<a href="{}">{}</a>', href, shown)
    button = format_html(
        '<button type="button" class="copy" data-copy="{}" title="Copy the whole value" aria-label="copy">'
        "copy</button>",
        value,
    )
    return format_html('<span class="ident-box">{}{}</span>', shown, button)
