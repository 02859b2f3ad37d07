"""OpenAPI generation (drf-spectacular): how the API key is documented, and what every request serializer
that refuses unknown fields looks like in the schema. Imported by config/urls.py, which registers the
extensions before the schema view runs."""

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension, OpenApiSerializerExtension

# Nested classes named after their role (the styleguide's InputSerializer, FilterSerializer) are named after
# their view in the schema, so two views' InputSerializers are two components, not one.
GENERIC_NESTED_NAMES = {"InputSerializer", "FilterSerializer"}


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "tenants.authentication.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {"type": "http", "scheme": "bearer", "description": "Tenant API key"}


def component_name(serializer_class: type) -> str | None:
    """`ConversationListCreateApi.InputSerializer` -> `ConversationListCreateInput`; None for any other
    class (drf-spectacular's own naming: the class name without `Serializer`)."""
    outer, _, inner = serializer_class.__qualname__.rpartition(".")
    if not outer or inner not in GENERIC_NESTED_NAMES:
        return None
    return outer.rpartition(".")[2].removesuffix("Api") + inner.removesuffix("Serializer")


class StrictSerializerSchema(OpenApiSerializerExtension):
    """A StrictSerializer answers 400 unknown_field for a key it does not declare: the schema says so with
    `additionalProperties: false`, so a client generator (or schemathesis) knows not to send one."""

    target_class = "tenants.api.StrictSerializer"
    match_subclasses = True

    def get_name(self, auto_schema: Any, direction: str) -> str | None:
        target = self.target if isinstance(self.target, type) else type(self.target)
        return component_name(target)

    def map_serializer(self, auto_schema: Any, direction: str) -> dict[str, Any]:
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        target = self.target if isinstance(self.target, type) else type(self.target)
        if target.__doc__ is None:  # not StrictSerializer's own docstring, inherited
            schema.pop("description", None)
        if direction == "request":
            schema["additionalProperties"] = False
            # What a serializer's validate() checks across fields, when JSON Schema can say it too.
            schema.update(getattr(self.target, "openapi_request_extra", {}))
        return schema
