"""Bearer-token authentication.

When tokens are configured (``STAGETUNE_API_TOKEN`` / ``STAGETUNE_API_TOKENS``) every write
(POST, PUT, PATCH, DELETE) needs ``Authorization: Bearer <token>``; reads need it too when
``STAGETUNE_PROTECT_READS`` is true. With no token configured the API is open. Tokens are
compared in constant time against every configured token.
"""

from __future__ import annotations

import hmac

from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.errors import ApiError
from tuner.settings import Settings

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

#: Declared in OpenAPI (the "Authorize" button of /docs); the check itself is ours.
bearer_scheme = HTTPBearer(
    auto_error=False,
    description="Needed for writes (and reads when protect_reads is on) when tokens are set.",
)


def token_matches(candidate: str, tokens: list[str]) -> bool:
    """Whether ``candidate`` equals one of ``tokens``, in time independent of where they differ."""
    given = candidate.encode("utf-8")
    found = False
    for token in tokens:
        # No short-circuit: every token is compared whatever the outcome.
        found |= hmac.compare_digest(given, token.encode("utf-8"))
    return found


def needs_token(settings: Settings, method: str) -> bool:
    """Whether a request with this HTTP method must carry a token under ``settings``."""
    if not settings.tokens:
        return False
    return method.upper() in WRITE_METHODS or settings.protect_reads


def check_credentials(settings: Settings, credentials: HTTPAuthorizationCredentials | None) -> None:
    """Raise 401 unless ``credentials`` carry one of the configured tokens."""
    if credentials is None:
        raise ApiError(
            401,
            "authentication required: send 'Authorization: Bearer <token>'",
            code="unauthorized",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if credentials.scheme.lower() != "bearer" or not token_matches(
        credentials.credentials, settings.tokens
    ):
        raise ApiError(
            401,
            "invalid token",
            code="unauthorized",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
