"""The schema's own parts: what the API refuses, the schema says it refuses (a
post-processing hook), and the name of its token authentication (an extension).

Imported by the API's URLs, so only a process that serves the API loads drf-spectacular's
schema machinery (a sweeper or a cluster worker never does).
May import: drf-spectacular and the API's errors.
"""

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerFieldExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object

from .. import validation
from ..calls import MAX_BACKEND
from .errors import CODES, codes_of


# Subclassing runs drf-spectacular's `__init_subclass__`, which it does not annotate.
class TokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """The schema's name for `tokens.TokenAuthentication`: ``tokenAuth``, ``Authorization: Token <key>``."""

    target_class = "cleanup.api.tokens.TokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: object) -> dict[str, Any]:
        return build_bearer_security_scheme_object(header_name="Authorization", token_prefix="Token")


# -- what the server checks of a value, as patterns -------------------------------------

# One character `cleanup.validation.clean_text_problem` refuses: a control (C0 but tab, DEL,
# C1) or a bidirectional control; as a regular expression's class.
_REFUSED = "".join(
    f"\\u{ord(first):04x}" + (f"-\\u{ord(last):04x}" if last != first else "")
    for first, last in (
        ("\x00", "\x08"),
        ("\x0a", "\x1f"),
        ("\x7f", "\x9f"),
        ("\u061c", "\u061c"),
        ("\u200e", "\u200f"),
        ("\u202a", "\u202e"),
        ("\u2066", "\u2069"),
    )
)
# Clean text that is not blank: no refused character, and one that is not a space.
CLEAN_TEXT_PATTERN = f"^[^{_REFUSED}]*[^{_REFUSED}\\s][^{_REFUSED}]*$"
# A backend's name in a path (`cleanup.calls.backend_name_ok`): no '/', no NUL, no space at
# either end; a path segment is never empty.
BACKEND_PATTERN = "^[^\\s/\\u0000](?:[^/\\u0000]*[^\\s/\\u0000])?$"


def clean_text(max_length: int) -> dict[str, Any]:
    """The schema of text a person writes (`cleanup.validation.text_error`): 1 to ``max_length``
    characters, no control character but tab, no bidirectional control, not blank."""
    return {"type": "string", "minLength": 1, "maxLength": max_length, "pattern": CLEAN_TEXT_PATTERN}


class CleanTextField(OpenApiSerializerFieldExtension):  # type: ignore[no-untyped-call]
    """`serializers.StrictCharField` in the schema: what `cleanup.validation.text_error` refuses, refused."""

    target_class = "cleanup.api.serializers.StrictCharField"

    def map_serializer_field(self, auto_schema: object, direction: str) -> dict[str, Any]:
        return clean_text(getattr(self.target, "max_length", None) or validation.MAX_REASON)


def state_the_checks(result: dict[str, Any], generator: object, request: object, public: bool) -> dict[str, Any]:
    """What the engine checks that a serializer does not say: a run's 1 to ``EVENT_MAX_STEPS``
    steps, and a backend's name in a path."""
    components = result.get("components", {}).get("schemas", {})
    steps = components.get("RunStart", {}).get("properties", {}).get("steps")
    if steps is not None:
        steps.update(minItems=1, maxItems=validation.limit("EVENT_MAX_STEPS"))
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            if not isinstance(operation, dict):
                continue
            for parameter in operation.get("parameters", []):
                if parameter.get("in") == "path" and parameter.get("name") == "backend":
                    parameter["schema"] = {"type": "string", "maxLength": MAX_BACKEND, "pattern": BACKEND_PATTERN}
                if parameter.get("in") == "path" and parameter.get("name") == "id":
                    parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": validation.MAX_INT}
    return result


PAGE_REF = "#/components/schemas/Paginated"
IF_NONE_MATCH = {
    "in": "header",
    "name": "If-None-Match",
    "required": False,
    "schema": {"type": "string"},
    "description": "The ETag of the page you hold: 304 with no body while it still shows the same.",
}
ETAG = {"schema": {"type": "string"}, "description": "The answer's entity tag (weak on a list), for If-None-Match."}


def document_conditionals(result: dict[str, Any], generator: object, request: object, public: bool) -> dict[str, Any]:
    """Every page of a list takes ``If-None-Match`` and may answer 304 (`pages.CursorPage`);
    every answer that carries an ``ETag`` says so."""
    for operations in result.get("paths", {}).values():
        operation = operations.get("get")
        if not isinstance(operation, dict):
            continue
        responses = operation.get("responses", {})
        ok = responses.get("200", {})
        ref = ok.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref", "")
        if ref.startswith(PAGE_REF):
            params = operation.setdefault("parameters", [])
            if not any(p.get("name") == "If-None-Match" for p in params):
                params.append(dict(IF_NONE_MATCH))
            responses.setdefault("304", {"description": "Not modified: the page whose ETag was sent is current."})
        if "304" in responses:
            ok.setdefault("headers", {})["ETag"] = ETAG
            operation["responses"] = dict(sorted(responses.items()))
    return result


# -- the errors ------------------------------------------------------------------------

ERROR_REF = {"$ref": "#/components/schemas/Error"}
# What each error status means, for its response's description.
WHEN = {
    400: "A bad body, an unknown field or query parameter, or a bad value of a known one.",
    401: "No credentials, or credentials that are not valid.",
    403: "Not staff, or without the endpoint's permission.",
    404: "No such object, or no endpoint at this path.",
    405: "A method the path does not have; Allow lists those it has.",
    406: "An Accept header that does not take JSON.",
    409: "The state does not allow it.",
    412: "An If-Match that is not the current ETag: the object changed since it was read.",
    413: "A body over the size limit.",
    415: "A body that is not application/json.",
    422: "An Idempotency-Key sent again with another body.",
    429: "Too many requests or too many runs running; Retry-After says when to try again.",
    500: "Something went wrong on the server; the answer says nothing of what.",
}
# The statuses every operation can answer; a write's; an operation on one object's.
EVERY_OPERATION = (400, 401, 403, 405, 406, 429, 500)
EVERY_WRITE = (413, 415)
ON_AN_OBJECT = (404,)


def statuses_of(path: str, method: str) -> set[int]:
    found = set(EVERY_OPERATION)
    if method in ("post", "put", "patch"):
        found.update(EVERY_WRITE)
    if "{" in path:
        found.update(ON_AN_OBJECT)
    return found


def declare_errors(result: dict[str, Any], generator: object, request: object, public: bool) -> dict[str, Any]:
    """Every status an operation can answer is in its responses, each with the `Error` envelope and
    the codes it can carry; an error a view declared itself (409) keeps its place."""
    assert set(WHEN) >= {status for status, _ in CODES.values()}, "a status without a description"
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            declared = {int(code) for code in responses if code.isdigit() and int(code) >= 400}
            for status in sorted(declared | statuses_of(path, method)):
                codes = ", ".join(codes_of(status))
                responses[str(status)] = {
                    "description": f"{WHEN[status]} Codes: {codes}.",
                    "content": {"application/json": {"schema": ERROR_REF}},
                }
            operation["responses"] = dict(sorted(responses.items()))
    return result


def refuse_unknown_fields(result: dict[str, Any], generator: object, request: object, public: bool) -> dict[str, Any]:
    """Every request body is an object whose unknown fields are refused (`serializers.StrictSerializer`,
    and `cleanup.runner.validate_spec` for each step): ``additionalProperties: false``."""
    components = result.get("components", {}).get("schemas", {})
    pending = [
        media["schema"]["$ref"]
        for path in result.get("paths", {}).values()
        for operation in path.values()
        if isinstance(operation, dict)
        for media in operation.get("requestBody", {}).get("content", {}).values()
        if "$ref" in media.get("schema", {})
    ]
    seen: set[str] = set()
    while pending:
        ref = pending.pop()
        name = ref.rsplit("/", 1)[-1]
        if name in seen or name not in components:
            continue
        seen.add(name)
        schema = components[name]
        if schema.get("type") == "object" and "properties" in schema:
            schema["additionalProperties"] = False
            for prop in schema["properties"].values():
                nested = prop.get("items", prop)
                if "$ref" in nested:
                    pending.append(nested["$ref"])
    return result


def only_current_version(endpoints: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The schema documents ``/api/v1/events/``: the deprecated ``/api/events/`` is the same API, and
    the schema's own endpoint is not part of it."""
    return [endpoint for endpoint in endpoints if endpoint[0].startswith("/api/v1/events/")]
