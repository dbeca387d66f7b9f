"""Request body size limit: 413 with the JSON error body, before a huge body is read.

A pure ASGI middleware (no buffering): a request whose ``Content-Length`` exceeds the limit is
answered at once without reading the body; otherwise the bytes actually received are counted
as the application reads them (chunked uploads, or a client that lies about its length), and
reading past the limit raises :class:`~api.errors.RequestTooLargeError`, which the error
handlers turn into the same 413 response.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import RequestTooLargeError, error_response


class BodySizeLimitMiddleware:
    """Reject request bodies larger than ``max_bytes`` with a 413 JSON error."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            try:
                too_large = int(declared) > self.max_bytes
            except ValueError:
                too_large = False  # the server rejects a malformed length itself
            if too_large:
                await self._reject(scope, receive, send)
                return

        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise RequestTooLargeError(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except RequestTooLargeError:
            # Normally the app's error handlers answer; this covers a body read outside them.
            if started:
                raise
            await self._reject(scope, receive, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = RequestTooLargeError(self.max_bytes)
        response = error_response(413, error.code, error.message, headers={"Connection": "close"})
        await response(scope, receive, send)
