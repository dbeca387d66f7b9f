"""Turning a request body into a validated :class:`~tuner.spec.StudySpec`.

The body is YAML (``application/yaml``, ``text/yaml``, their ``x-`` variants, or no
``Content-Type`` at all) or JSON (``application/json`` and ``+json`` types). YAML is parsed
with ``yaml.safe_load`` only, and documents that use aliases (``*ref``) are refused: an alias
can make a small body expand into an enormous structure ("billion laughs"). Every problem
becomes a 422 whose ``details`` name the field and the reason; the task is looked up by
registered name only (nothing in a request is ever imported).
"""

from __future__ import annotations

import json
from typing import Any, Final

import pydantic
import yaml

from api.errors import ApiError, validation_details, validation_message
from tuner.spec import StudySpec

JSON_TYPES: Final = frozenset({"application/json"})
YAML_TYPES: Final = frozenset(
    {"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain"}
)
_OBJECTIVE_KINDS: Final = frozenset({"accuracy", "time_to_accuracy", "pareto"})


def media_type(content_type: str | None) -> str:
    """``"application/json; charset=utf-8"`` -> ``"application/json"`` ('' when absent)."""
    if not content_type:
        return ""
    return content_type.split(";", 1)[0].strip().lower()


def _invalid(message: str, field: str = "", kind: str = "value_error") -> ApiError:
    detail = {"field": field, "loc": ["body", *([field] if field else [])], "message": message}
    return ApiError(422, message, code="validation_error", details=[{**detail, "type": kind}])


def parse_body(body: bytes, content_type: str | None) -> Any:
    """The parsed document of a spec body (raises 415 / 422 ``ApiError``)."""
    kind = media_type(content_type)
    is_json = kind in JSON_TYPES or kind.endswith("+json")
    if not (is_json or kind in YAML_TYPES or kind == ""):
        raise ApiError(
            415,
            f"unsupported Content-Type {kind!r}: send the study spec as application/json "
            "or application/yaml (text/yaml)",
            code="unsupported_media_type",
        )
    if not body.strip():
        raise _invalid("empty request body: send a study spec (at least 'task: <name>')")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"request body is not UTF-8 text (byte {exc.start})") from None
    if is_json:
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise _invalid(
                f"body is not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
                kind="json_invalid",
            ) from None
    return _load_yaml(text)


def _load_yaml(text: str) -> Any:
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                raise _invalid(
                    "YAML aliases (*name) are not accepted in a study spec; write the values out",
                    kind="yaml_alias",
                )
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise _invalid(f"body is not valid YAML{where}: {problem}", kind="yaml_invalid") from None


def spec_error_details(exc: pydantic.ValidationError) -> list[dict[str, Any]]:
    """``details`` of a spec that failed validation: field path and reason per problem."""
    errors = []
    for err in exc.errors(include_url=False):
        loc = list(err["loc"])
        if len(loc) > 1 and loc[0] == "objective" and loc[1] in _OBJECTIVE_KINDS:
            del loc[1]  # the discriminator's tag, not a field
        msg = str(err["msg"])
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see the documented spec fields)"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        errors.append({"loc": ("body", *loc), "msg": msg, "type": err["type"]})
    return validation_details(errors)


def validate_spec(document: Any) -> StudySpec:
    """A :class:`StudySpec` from a parsed body, or a 422 ``ApiError`` naming each problem."""
    if not isinstance(document, dict):
        raise _invalid(
            "the study spec must be a mapping with at least 'task: <name>', "
            f"not {type(document).__name__}",
            kind="model_type",
        )
    try:
        return StudySpec.model_validate(document)
    except pydantic.ValidationError as exc:
        details = spec_error_details(exc)
        message = validation_message(details).replace("invalid request", "invalid study spec", 1)
        raise ApiError(422, message, code="validation_error", details=details) from None


def spec_from_body(body: bytes, content_type: str | None) -> StudySpec:
    return validate_spec(parse_body(body, content_type))
