"""Domain errors of stagetune's core.

Every error a user can cause or act on derives from :class:`StagetuneError`. The API maps these
classes to HTTP statuses in exactly one place (``api/errors.py``); the CLI prints their message
as one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pydantic


class StagetuneError(Exception):
    """Base class of every domain error."""


class ValidationError(StagetuneError, ValueError):
    """Input (a schedule, a spec, a request) is invalid; the message says what and how to fix it."""


class NotFoundError(StagetuneError, LookupError):
    """A study, trial or task that does not exist."""


class ConflictError(StagetuneError):
    """The operation conflicts with existing data (duplicate, concurrent claim)."""


class ClusterUnavailableError(StagetuneError):
    """Ray could not be reached (the cluster ``RAY_ADDRESS`` names, or a local instance that
    would not start) before a study's trials began: nothing of the study ran, and running it
    again later may succeed. The runner gives such a study back to the queue."""


class InvalidStateError(StagetuneError):
    """The operation is not allowed in the object's current state (e.g. delete a running study)."""


@dataclass(frozen=True)
class FieldProblem:
    """One problem of a pydantic model that failed validation, as stagetune's messages use it:
    ``message`` is pydantic's without its ``Value error, `` prefix (the text our validators
    raise), ``has_input`` says whether pydantic reported the offending value."""

    loc: tuple[str | int, ...]
    message: str
    type: str
    ctx: Mapping[str, Any] = field(default_factory=dict)
    input: Any = None
    has_input: bool = False


def field_problems(exc: pydantic.ValidationError) -> list[FieldProblem]:
    """The problems of ``exc`` in order: the one reading of pydantic's errors behind the
    study-spec messages (``tuner.spec.spec_problems``) and the trial-config messages
    (``tuner.trial_config``)."""
    out = []
    for err in exc.errors(include_url=False):
        msg = str(err["msg"])
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        out.append(
            FieldProblem(
                loc=tuple(err["loc"]),
                message=msg,
                type=str(err["type"]),
                ctx=dict(err.get("ctx") or {}),
                input=err.get("input"),
                has_input="input" in err,
            )
        )
    return out
