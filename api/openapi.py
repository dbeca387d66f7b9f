"""The OpenAPI document: FastAPI's, plus the StudySpec schema the POST body refers to.

``POST /studies`` reads its body itself (JSON or YAML), so FastAPI cannot derive the schema
from a parameter; the spec's JSON Schema is added to ``components.schemas`` here.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from tuner.spec import StudySpec

REF_TEMPLATE = "#/components/schemas/{model}"


def spec_schemas() -> dict[str, Any]:
    """``StudySpec`` and the models it uses, keyed by name, with component refs."""
    schema = StudySpec.model_json_schema(ref_template=REF_TEMPLATE)
    defs: dict[str, Any] = schema.pop("$defs", {})
    return {**defs, "StudySpec": schema}


def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` include the StudySpec schemas (generated once, then cached)."""

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
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
