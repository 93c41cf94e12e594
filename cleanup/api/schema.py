"""Schema post-processing: what the API refuses, the schema says it refuses.

May import: drf-spectacular only.
"""


def refuse_unknown_fields(result, generator, request, public):
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
    seen = set()
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


def only_current_version(endpoints):
    """The schema documents ``/api/v1/events/``: the deprecated ``/api/events/`` is the same API, and
    the schema's own endpoint is not part of it."""
    return [endpoint for endpoint in endpoints if endpoint[0].startswith("/api/v1/events/")]
