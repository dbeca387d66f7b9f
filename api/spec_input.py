"""Turning a request body into a validated :class:`~tuner.spec.StudySpec`.

The body is YAML (``application/yaml``, ``text/yaml``, their ``x-`` variants, or no
``Content-Type`` at all) or JSON (``application/json`` and ``+json`` types). Every problem
becomes a 422 whose ``details`` name the field and the reason; the task is looked up by
registered name only (nothing in a request is ever imported).

Parsing is bounded before and while it runs:

* a body over :data:`~tuner.spec.MAX_SPEC_CHARS` characters is refused with a 413 before any
  parser sees it;
* nesting deeper than :data:`MAX_NESTING` collections is refused with a 422 naming the limit
  (deep nesting makes the parsers recurse until ``RecursionError``, and PyYAML's and libyaml's
  scanners are quadratic in flow nesting). JSON: a linear pre-scan of the text, before
  ``json.loads``. YAML: the document is composed from the parser's event stream in one
  iterative pass that stops at the first collection deeper than the limit (the scanner only
  ever runs a bounded distance ahead of that point, so the cost is linear);
* YAML is read with safe-loader semantics only (``yaml.CSafeLoader`` when PyYAML has libyaml,
  else ``yaml.SafeLoader``: never a loader that constructs Python objects), in a single pass
  that also refuses aliases (``*ref``: a small body could expand into an enormous structure,
  "billion laughs");
* JSON's non-standard constants (``NaN``, ``Infinity``, ``-Infinity``) are refused, and an
  integer literal too long for Python (``sys.get_int_max_str_digits()``) is a 422, not a 500.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Final, NoReturn

import pydantic
import yaml

from api.errors import ApiError, validation_details, validation_message
from tuner.spec import MAX_SPEC_CHARS, StudySpec, spec_problems

JSON_TYPES: Final = frozenset({"application/json"})
YAML_TYPES: Final = frozenset(
    {"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain"}
)
MAX_NESTING: Final = 32
"""Deepest nesting of lists / mappings accepted in a spec body (the spec itself needs ~4)."""

_YAML_LOADER: Final[type[yaml.SafeLoader] | type[yaml.CSafeLoader]] = getattr(
    yaml, "CSafeLoader", yaml.SafeLoader
)
# A JSON string (skipped: brackets inside it are text), or one bracket.
_JSON_TOKEN: Final = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.DOTALL)


def media_type(content_type: str | None) -> str:
    """``"application/json; charset=utf-8"`` -> ``"application/json"`` ('' when absent)."""
    if not content_type:
        return ""
    return content_type.split(";", 1)[0].strip().lower()


def _invalid(message: str, field: str = "", kind: str = "value_error") -> ApiError:
    detail = {"field": field, "loc": ["body", *([field] if field else [])], "message": message}
    return ApiError(422, message, code="validation_error", details=[{**detail, "type": kind}])


def _too_deep() -> ApiError:
    return _invalid(
        f"body is nested too deeply: at most {MAX_NESTING} levels of lists/mappings "
        "are accepted in a study spec",
        kind="nesting_too_deep",
    )


def _unreadable_number(exc: ValueError | OverflowError) -> ApiError:
    if "integer string conversion" in str(exc):
        return _invalid(
            f"body has an integer literal longer than {sys.get_int_max_str_digits()} digits; "
            "numbers that large are not accepted",
            kind="int_too_long",
        )
    return _invalid(f"body has a value that cannot be read: {exc}", kind="value_error")


def parse_body(body: bytes, content_type: str | None) -> Any:
    """The parsed document of a spec body (raises 413 / 415 / 422 ``ApiError``)."""
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
    if len(body) > 4 * MAX_SPEC_CHARS:  # more characters than the limit whatever the text
        raise _spec_too_large()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"request body is not UTF-8 text (byte {exc.start})") from None
    if len(text) > MAX_SPEC_CHARS:
        raise _spec_too_large()
    try:
        return _load_json(text) if is_json else _load_yaml(text)
    except RecursionError:  # the limits above should make this unreachable
        raise _too_deep() from None
    except (ValueError, OverflowError) as exc:  # int_max_str_digits, impossible dates
        raise _unreadable_number(exc) from None


def _spec_too_large() -> ApiError:
    return ApiError(
        413,
        f"study spec too large: the limit is {MAX_SPEC_CHARS} characters",
        code="request_too_large",
    )


# ---------------------------------------------------------------------------------- JSON


def json_nesting_depth(text: str, limit: int = MAX_NESTING) -> int:
    """The deepest ``[``/``{`` nesting of JSON text (brackets in strings do not count), in one
    linear pass that stops as soon as it exceeds ``limit`` (then returns ``limit + 1``)."""
    depth = deepest = 0
    for match in _JSON_TOKEN.finditer(text):
        char = match.group()
        if char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif char in "]}":
            depth = max(depth - 1, 0)
    return deepest


class _JsonConstantError(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _refuse_constant(name: str) -> NoReturn:
    raise _JsonConstantError(name)


def _load_json(text: str) -> Any:
    if json_nesting_depth(text) > MAX_NESTING:
        raise _too_deep()
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except _JsonConstantError as exc:
        raise _invalid(
            f"body is not valid JSON: {exc.name} is not a JSON number (RFC 8259); "
            "send a finite number",
            kind="json_invalid",
        ) from None
    except json.JSONDecodeError as exc:
        hint = ""
        if _looks_like_yaml(text):
            hint = "; it looks like YAML: send it with Content-Type: application/yaml"
        raise _invalid(
            f"body is not valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}{hint}",
            kind="json_invalid",
        ) from None


def _looks_like_yaml(text: str) -> bool:
    """A YAML mapping sent as JSON (the usual mistake with curl -d @spec.yaml)."""
    try:
        return isinstance(_load_yaml(text), dict)
    except ApiError:
        return False


# ---------------------------------------------------------------------------------- YAML


def _load_yaml(text: str) -> Any:
    # Typed ``Any``: the stubs of the C and the pure-Python loader disagree on Mark types.
    loader: Any = _YAML_LOADER(text)
    try:
        node = _compose_single_document(loader)
        return None if node is None else loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        if "maximum nesting depth" in problem:
            # libyaml (0.2.5 and later) scans a flow collection's tokens ahead and stops a
            # nesting bomb itself, before an event reaches the depth check.
            raise _too_deep() from None
        raise _invalid(f"body is not valid YAML{where}: {problem}", kind="yaml_invalid") from None
    finally:
        loader.dispose()


def _compose_single_document(loader: Any) -> yaml.Node | None:
    """The node graph of the stream's only document, like ``Composer.get_single_node`` but
    iterative, refusing aliases and nesting deeper than :data:`MAX_NESTING` as the events
    arrive (so a nesting bomb stops the parser a bounded distance past the limit)."""
    loader.get_event()  # StreamStartEvent
    if loader.check_event(yaml.StreamEndEvent):
        loader.get_event()
        return None
    document = loader.get_event()  # DocumentStartEvent
    root = _compose_node(loader)
    loader.get_event()  # DocumentEndEvent
    if not loader.check_event(yaml.StreamEndEvent):
        event = loader.get_event()
        raise yaml.composer.ComposerError(
            "expected a single document in the stream",
            document.start_mark,
            "found a second document (a study spec is one YAML document)",
            event.start_mark,
        )
    loader.get_event()
    return root


def _compose_node(loader: Any) -> yaml.Node:
    open_nodes: list[yaml.SequenceNode | yaml.MappingNode] = []
    pending_keys: list[yaml.Node | None] = []  # per open mapping: a key waiting for its value
    while True:
        event = loader.get_event()
        # A C or a Python Mark (the node stubs accept only the latter).
        start: Any = event.start_mark
        end: Any = event.end_mark
        node: yaml.Node
        if isinstance(event, yaml.AliasEvent):
            raise _invalid(
                "YAML aliases (*name) are not accepted in a study spec; write the values out",
                kind="yaml_alias",
            )
        if isinstance(event, yaml.ScalarEvent):
            tag = event.tag
            if tag is None or tag == "!":
                tag = loader.resolve(yaml.ScalarNode, event.value, event.implicit)
            node = yaml.ScalarNode(tag, event.value, start, end, style=event.style)
        elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            if len(open_nodes) >= MAX_NESTING:
                raise _too_deep()
            tag = event.tag
            collection: yaml.SequenceNode | yaml.MappingNode
            if isinstance(event, yaml.SequenceStartEvent):
                if tag is None or tag == "!":
                    tag = loader.resolve(yaml.SequenceNode, None, event.implicit)
                collection = yaml.SequenceNode(tag, [], start, None, flow_style=event.flow_style)
            else:
                if tag is None or tag == "!":
                    tag = loader.resolve(yaml.MappingNode, None, event.implicit)
                collection = yaml.MappingNode(tag, [], start, None, flow_style=event.flow_style)
                pending_keys.append(None)
            open_nodes.append(collection)
            continue
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            node = open_nodes.pop()
            node.end_mark = end
            if isinstance(node, yaml.MappingNode):
                pending_keys.pop()
        else:  # the parser guarantees the event order; anything else is a bug
            raise yaml.composer.ComposerError(
                None, None, f"unexpected {type(event).__name__}", event.start_mark
            )
        if not open_nodes:
            return node
        parent = open_nodes[-1]
        if isinstance(parent, yaml.SequenceNode):
            parent.value.append(node)
        elif pending_keys[-1] is None:
            pending_keys[-1] = node
        else:
            parent.value.append((pending_keys[-1], node))
            pending_keys[-1] = None


def spec_error_details(exc: pydantic.ValidationError) -> list[dict[str, Any]]:
    """``details`` of a spec that failed validation: field path and reason per problem."""
    errors = [
        {"loc": ("body", *loc), "msg": msg, "type": kind} for loc, msg, kind in spec_problems(exc)
    ]
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
