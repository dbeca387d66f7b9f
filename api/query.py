"""One value per single-valued query parameter: a repeated one is a 422, not the last one.

Starlette keeps every value of a repeated query parameter and FastAPI reads the *last* one for a
scalar parameter, so ``?limit=5&limit=abc&limit=100`` used to list 100 studies: the garbage was
silently dropped and the client never learnt that its request was ambiguous. The dependency
:func:`single_valued_query` refuses such a request with the usual validation error, naming the
parameter. Parameters declared as lists (``status``, "repeatable" in the API documentation) may
repeat as before.

Which parameters are single-valued is read from the matched route's declared query parameters
(its dependant and its dependencies') when a request repeats any parameter.
"""

from __future__ import annotations

import types
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError

_SEQUENCE_TYPES = (list, tuple, set, frozenset)


def _is_sequence(annotation: Any) -> bool:
    origin = get_origin(annotation)
    if origin is Annotated:
        return _is_sequence(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return any(_is_sequence(arg) for arg in get_args(annotation))
    target = origin if origin is not None else annotation
    return (
        isinstance(target, type)
        and issubclass(target, (*_SEQUENCE_TYPES, Sequence))
        and (not issubclass(target, (str, bytes)))
    )


def _query_fields(dependant: Dependant) -> Iterator[Any]:
    yield from dependant.query_params
    for sub in dependant.dependencies:
        yield from _query_fields(sub)


def single_valued_names(dependant: Dependant) -> frozenset[str]:
    """The names (aliases) of ``dependant``'s query parameters that take one value."""
    return frozenset(
        field.alias
        for field in _query_fields(dependant)
        if not _is_sequence(field.field_info.annotation)
    )


async def single_valued_query(request: Request) -> None:
    """Refuse a request that repeats a single-valued query parameter (422 naming it)."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    if len(request.query_params.multi_items()) == len(request.query_params):
        return  # nothing repeated: the common case costs one pass over the query
    names = single_valued_names(dependant)
    repeated = sorted(name for name in names if len(request.query_params.getlist(name)) > 1)
    if repeated:
        raise RequestValidationError(
            [
                {
                    "loc": ("query", name),
                    "msg": f"given {len(request.query_params.getlist(name))} times: give one value",
                    "type": "repeated_parameter",
                }
                for name in repeated
            ]
        )
