"""Domain errors of stagetune's core.

Every error a user can cause or act on derives from :class:`StagetuneError`. The API maps these
classes to HTTP statuses in exactly one place (``api/errors.py``); the CLI prints their message
as one line.
"""

from __future__ import annotations


class StagetuneError(Exception):
    """Base class of every domain error."""


class ValidationError(StagetuneError, ValueError):
    """Input (a schedule, a spec, a request) is invalid; the message says what and how to fix it."""


class NotFoundError(StagetuneError, LookupError):
    """A study, trial or task that does not exist."""


class ConflictError(StagetuneError):
    """The operation conflicts with existing data (duplicate, concurrent claim)."""


class InvalidStateError(StagetuneError):
    """The operation is not allowed in the object's current state (e.g. delete a running study)."""
