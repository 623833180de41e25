"""The chat page at `/`: static files shipped in the package (static/), read once, served as
they are. The page is public; the API calls it makes carry the key the user enters."""

from __future__ import annotations

from functools import cache
from importlib.resources import files

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

# path -> (file in static/, media type)
FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/chat.js": ("chat.js", "text/javascript; charset=utf-8"),
    "/static/chat.css": ("chat.css", "text/css; charset=utf-8"),
}
HEADERS = {
    # Only this server's own script, style and API: no inline code, no third-party origin.
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


@cache
def _read(name: str) -> bytes:
    return files(__package__).joinpath("static", name).read_bytes()


async def _serve(request: Request) -> Response:
    name, media_type = FILES[request.url.path]
    return Response(_read(name), media_type=media_type, headers=HEADERS)


def routes() -> list[Route]:
    """The page's routes; not API routes, so not in /openapi.json."""
    return [Route(path, _serve, methods=["GET", "HEAD"], include_in_schema=False) for path in FILES]
