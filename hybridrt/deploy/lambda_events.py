"""API Gateway HTTP API / Lambda function URL events (payload format 2.0) in and out: the
method, path and headers of an event, its JSON body (base64 or not, within the server's body
limit), and a JSON response."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from ..serve.protocol import UNSUPPORTED, ApiError, check_fields, parse_json
from ..serve.settings import ServeConfig

JSON_TYPE = "application/json"


def http_request(event: Any) -> tuple[str, str, dict[str, str]]:
    if not isinstance(event, dict) or event.get("version") != "2.0":
        raise ApiError(400, "the event is not an API Gateway HTTP API / function URL event (payload format 2.0)")
    http = (event.get("requestContext") or {}).get("http") if isinstance(event.get("requestContext"), dict) else None
    if not isinstance(http, dict) or not isinstance(http.get("method"), str):
        raise ApiError(400, "the event has no requestContext.http.method")
    path = event.get("rawPath", http.get("path"))
    if not isinstance(path, str):
        raise ApiError(400, "the event has no rawPath")
    headers = event.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise ApiError(400, "the event's headers must be an object of strings")
    path = path.rstrip("/") or "/"
    return http["method"].upper(), path, {str(k).lower(): v for k, v in headers.items()}


def json_body(event: dict[str, Any], known: set[str], model_name: str) -> dict[str, Any]:
    raw = event.get("body")
    if raw is None:
        raise ApiError(400, "the request has no body: send a JSON object")
    if not isinstance(raw, str):
        raise ApiError(400, "the event's body must be a string")
    encoded = event.get("isBase64Encoded", False)
    if not isinstance(encoded, bool):
        raise ApiError(400, "the event's isBase64Encoded must be true or false")
    if encoded:
        try:
            data = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "the request body is not valid base64 (isBase64Encoded is true)") from None
    else:
        data = raw.encode("utf-8", "surrogatepass")
    limit = ServeConfig.max_body_bytes
    if len(data) > limit:
        raise ApiError(413, f"the request body exceeds {limit} bytes")
    body = parse_json(data)
    check_fields(body, known, model_name, UNSUPPORTED)
    return body


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> dict[str, Any]:
    out = {"content-type": JSON_TYPE} | {k.lower(): v for k, v in (headers or {}).items()}
    return {
        "statusCode": status,
        "headers": out,
        "body": json.dumps(body, ensure_ascii=False),
        "isBase64Encoded": False,
    }
