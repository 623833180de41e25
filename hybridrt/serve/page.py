"""The chat page at `/`: static files shipped in the package (static/), read once, served as
they are. The page is public; the API calls it makes carry the key the user enters. The page
says whether this server wants a key (a meta tag), so that it makes no call it knows will be
refused."""

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
    # Public like the page: a browser asks for its icon on its own, with no key (a 401 there was
    # logged in the page's console).
    "/static/favicon.svg": ("favicon.svg", "image/svg+xml"),
    "/favicon.ico": ("favicon.svg", "image/svg+xml"),
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


KEY_META = b'<meta name="hybridrt-api-key" content="optional">'


def routes(key_required: bool = False) -> list[Route]:
    """The page's routes; not API routes, so not in /openapi.json. Bodies are read once, the
    page's key meta tag set for this server."""
    bodies = {path: _read(name) for path, (name, _) in FILES.items()}
    if key_required:
        bodies["/"] = bodies["/"].replace(KEY_META, KEY_META.replace(b"optional", b"required"))

    async def serve(request: Request) -> Response:
        path = request.url.path
        return Response(bodies[path], media_type=FILES[path][1], headers=HEADERS)

    return [Route(path, serve, methods=["GET", "HEAD"], include_in_schema=False) for path in FILES]
