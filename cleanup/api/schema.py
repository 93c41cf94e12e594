"""The schema's own parts: what the API refuses, the schema says it refuses (a
post-processing hook), and the name of its token authentication (an extension).

Imported by the API's URLs, so only a process that serves the API loads drf-spectacular's
schema machinery (a sweeper or a cluster worker never does).
May import: drf-spectacular and the API's errors.
"""

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object

from .errors import CODES, codes_of


class TokenScheme(OpenApiAuthenticationExtension):
    """The schema's name for `tokens.TokenAuthentication`: ``tokenAuth``, ``Authorization: Token <key>``."""

    target_class = "cleanup.api.tokens.TokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema: object) -> dict[str, Any]:
        return build_bearer_security_scheme_object(header_name="Authorization", token_prefix="Token")


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
    413: "A body over the size limit.",
    415: "A body that is not application/json.",
    422: "An Idempotency-Key sent again with another body.",
    429: "Too many requests or too many runs running; Retry-After says when to try again.",
}
# The statuses every operation can answer; a write's; an operation on one object's.
EVERY_OPERATION = (400, 401, 403, 405, 406, 429)
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
    assert set(WHEN) >= {status for status, _ in CODES.values() if status < 500}, "a status without a description"
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
