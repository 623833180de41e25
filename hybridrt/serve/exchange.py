"""One HTTP request handed to the server's ASGI app in the same process, without a socket: the
gRPC door (grpc_api.py) and a Ray Serve replica (deploy/ray_serve.py) answer through the HTTP
app itself this way, so they share its key check, parsing, errors, engine queue and log line
(its `door` field names the way in)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any


class Exchange:
    """One request handed to the ASGI app in-process: the body is sent at once, the
    response's messages are read as they come (a bounded queue: a slow reader holds the
    app back as a slow socket would), and closing it is a client that went away."""

    def __init__(
        self,
        app: Any,
        method: str,
        path: str,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        door: str = "grpc",
        query: bytes = b"",
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.gone = asyncio.Event()
        self.queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=8)
        self.status, self.body, self.ended, self.door = 0, body, False, door
        self.headers: dict[str, str] = {}
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "2",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query,
            "root_path": "",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
            "client": None,
            "server": None,
            "hybridrt.door": door,
            **(extra or {}),
        }
        self.scope = scope  # the app's request.scope: what it records there is read back here
        self.task = asyncio.ensure_future(self._run(app, scope))

    async def _run(self, app: Any, scope: dict[str, Any]) -> None:
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": self.body, "more_body": False}
            await self.gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if self.gone.is_set():
                raise OSError(f"the {self.door} call ended")  # as a closed socket: the app stops writing
            await self.queue.put(message)

        try:
            await app(scope, receive, send)
        finally:
            await self.queue.put(None)

    async def start(self) -> int:
        """Wait for the response to start; its status (headers in self.headers)."""
        while True:
            message = await self._next()
            if message is None:
                return 500
            if message["type"] == "http.response.start":
                self.status = message["status"]
                self.headers = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
                return self.status

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            message = await self._next()
            if message is None:
                return
            if message["type"] == "http.response.body":
                yield message.get("body", b"")
                if not message.get("more_body", False):
                    return

    async def close(self) -> None:
        """The client is gone: read what the app still sends until it has finished (its log line
        written), the way a closed socket's writes fail."""
        self.gone.set()
        while not self.ended and await self._next() is not None:
            pass
        with contextlib.suppress(Exception):  # a write after the client left ends the app with OSError
            await self.task

    async def _next(self) -> dict[str, Any] | None:
        message = await self.queue.get()
        self.ended = self.ended or message is None
        return message
