"""The API's routes: method and path to handler, `{name}` path parameters."""

from __future__ import annotations

import re
from urllib.parse import unquote

from edged.api.http.messages import Handler, HttpError, Request

_PARAM = re.compile(r"\{(\w+)(?::([^{}]+))?\}")
MAX_MATCHED = 1024  # dynamic paths remembered (a path of at most MAX_MATCHED_PATH characters)
MAX_MATCHED_PATH = 256


class Router:
    """Routes by method and path. `{name}` matches one path segment (percent-decoded),
    `{name:regex}` what the regex does. Static paths are a dict lookup; the rest are tried in
    the order added. HEAD is answered as GET without the body."""

    def __init__(self) -> None:
        self._static: dict[str, dict[str, Handler]] = {}
        self._dynamic: list[tuple[re.Pattern[str], dict[str, Handler]]] = []
        # Dynamic paths matched before (clients repeat them: /v2/models/m/infer), with what
        # the match came to; emptied when full.
        self._matched: dict[str, tuple[dict[str, Handler], dict[str, str]]] = {}

    def add(self, method: str, path: str, handler: Handler) -> None:
        self._matched.clear()
        if _PARAM.search(path) is None:
            self._static.setdefault(path, {})[method] = handler
            return
        pattern = re.compile("^" + _compile(path) + "$")
        for existing, methods in self._dynamic:
            if existing.pattern == pattern.pattern:
                methods[method] = handler
                return
        self._dynamic.append((pattern, {method: handler}))

    def resolve(self, request: Request) -> Handler:
        method = "GET" if request.method == "HEAD" else request.method
        methods = self._static.get(request.path)
        if methods is None:
            seen = self._matched.get(request.path)
            if seen is not None:
                methods, info = seen
                request.match_info = dict(info)
            else:
                methods = self._match(request)
        handler = methods.get(method) or methods.get("*")
        if handler is None:
            raise HttpError(405, "Method Not Allowed", allow=", ".join(sorted(methods)))
        return handler

    def _match(self, request: Request) -> dict[str, Handler]:
        for pattern, candidates in self._dynamic:
            match = pattern.match(request.path)
            if match is not None:
                request.match_info = {k: unquote(v) if "%" in v else v
                                      for k, v in match.groupdict().items()}
                if len(request.path) <= MAX_MATCHED_PATH:
                    if len(self._matched) >= MAX_MATCHED:
                        self._matched.clear()
                    self._matched[request.path] = (candidates, dict(request.match_info))
                return candidates
        raise HttpError(404, "Not Found")


def _compile(path: str) -> str:
    out, last = [], 0
    for match in _PARAM.finditer(path):
        out.append(re.escape(path[last:match.start()]))
        out.append(f"(?P<{match.group(1)}>{match.group(2) or '[^/]+'})")
        last = match.end()
    out.append(re.escape(path[last:]))
    return "".join(out)


