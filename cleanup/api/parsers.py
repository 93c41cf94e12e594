"""The one parser of the API: bounded JSON whose every value can be stored.

May import: `validation` and the API's errors.
"""

import codecs
from collections.abc import Mapping
from typing import IO, Any

from django.conf import settings
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import JSONParser

from .. import validation
from .errors import PayloadTooLarge, body_limit

# The body's own envelope (``{"steps": [{"params": ...}]}``) sits above what the engine
# bounds at `validation.MAX_DEPTH`; the parser only keeps pathological nesting out.
BODY_MAX_DEPTH = 2 * validation.MAX_DEPTH


class BoundedJSONParser(JSONParser):
    """JSON bodies of at most ``DATA_UPLOAD_MAX_MEMORY_SIZE`` bytes, each value storable.

    DRF reads the body from the stream, past Django's own size check, and the standard
    parser lets ``1e400`` (infinity), lone surrogates and a recursion error through.
    """

    def parse(
        self, stream: IO[Any], media_type: str | None = None, parser_context: Mapping[str, Any] | None = None
    ) -> Any:
        limit = body_limit()
        raw = stream.read() if limit is None else stream.read(limit + 1)
        if limit is not None and len(raw) > limit:
            raise PayloadTooLarge()
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            text = codecs.decode(raw, encoding)
        except (UnicodeDecodeError, LookupError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        try:
            data = validation.parse_json(text, max_depth=BODY_MAX_DEPTH)
        except validation.Invalid as exc:
            field, message = next(iter(exc.errors.items()))
            if message.startswith("is not valid JSON"):
                raise ParseError(f"JSON parse error - {message.removeprefix('is not valid JSON: ')}") from None
            raise ValidationError({field: [message]}) from None
        return data
