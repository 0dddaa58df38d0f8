"""Reading the API's small JSON request bodies (repository, shared memory, logging): a JSON
object or an InvalidInput that says what is wrong, and typed fields from it."""

from __future__ import annotations

from typing import Any

from edged.api.http import jsontext
from edged.api.http.budget import read_body
from edged.api.http.messages import Request
from edged.core.errors import InvalidInput

# Repository, shared memory and logging requests are a few hundred bytes: more is refused (413)
# before it is parsed, on the loop.
SMALL_BODY_BYTES = 64 * 1024


async def json_body(request: Request, default: dict[str, Any] | None = None
                     ) -> dict[str, Any]:
    raw = bytes(await read_body(request, SMALL_BODY_BYTES))
    if not raw.strip() and default is not None:
        return default
    body = jsontext.loads(raw)
    if not isinstance(body, dict):
        raise InvalidInput("the request body must be a JSON object")
    return body


def integer(body: dict[str, Any], key: str, default: int | None = None) -> int:
    value = body.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidInput(f"{key} must be an integer")
    return value
