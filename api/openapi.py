"""The OpenAPI document: FastAPI's, plus the StudySpec schema the POST body refers to.

``POST /studies`` reads its body itself (JSON or YAML), so FastAPI cannot derive the schema
from a parameter; the spec's JSON Schema is added to ``components.schemas`` here.

Security requirements follow the server's settings: every route declares the bearer scheme
(it is a dependency of them all), but an operation only lists it when this server would ask
for a token: none without configured tokens, writes only unless reads are protected too.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.auth import needs_token
from tuner.settings import Settings
from tuner.spec import StudySpec

REF_TEMPLATE = "#/components/schemas/{model}"


def spec_schemas() -> dict[str, Any]:
    """``StudySpec`` and the models it uses, keyed by name, with component refs."""
    schema = StudySpec.model_json_schema(ref_template=REF_TEMPLATE)
    defs: dict[str, Any] = schema.pop("$defs", {})
    return {**defs, "StudySpec": schema}


HTTP_METHODS = frozenset({"get", "put", "post", "delete", "options", "head", "patch", "trace"})


def apply_security(document: dict[str, Any], settings: Settings) -> None:
    """Keep an operation's ``security`` only where ``settings`` make the server ask for a token,
    and drop the security schemes altogether when no operation needs one."""
    needed = False
    for path_item in document.get("paths", {}).values():
        for method, operation in path_item.items():
            if method not in HTTP_METHODS or "security" not in operation:
                continue
            if needs_token(settings, method):
                needed = True
            else:
                del operation["security"]
    components = document.get("components", {})
    if not needed and "securitySchemes" in components:
        del components["securitySchemes"]


def install_openapi(app: FastAPI, settings: Settings) -> None:
    """Make ``app.openapi()`` include the StudySpec schemas and the security ``settings`` ask
    for (generated once, then cached)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            components = document.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in spec_schemas().items():
                components.setdefault(name, schema)
            apply_security(document, settings)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
