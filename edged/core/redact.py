"""What a remote caller may read of a message the device wrote for its own users: nothing of
its filesystem. An MQTT request's error answer, an OTA status published to the fleet: the
model, its version and what is wrong stay; a file of the model repository reads as the
repository names it (`<model>/<version>/model.onnx`), any other path as UNSAID."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

# What a path is made of in an error's text: it ends at a space, a quote, a bracket, a comma
# or a colon ("<file>: what is wrong", as ONNX, ONNX Runtime and edged write it).
_PATH_CHARS = r"[^\s'\"`,;:()\[\]{}<>]"
# A path from the root, the home or here, not inside a word, a URL or a relative path.
_OTHER_PATHS = re.compile(r"(?<![\w.~/:-])(?:file://|~|\.{1,2})?/" + _PATH_CHARS + "+")
UNSAID = "<path>"  # what stands where a path was


def remote_text(text: str, repository: Path, others: Iterable[Path] = ()) -> str:
    """`text` with nothing of the filesystem: a file or folder of the model repository as the
    repository names it (`<model>/<version>/model.onnx`: the documented layout, no more; its
    hidden folders as UNSAID), one
    in parentheses dropped (edged writes its folders there as a detail for its local users),
    any other path (`others` as written too: a relative one is a path only where a `/`
    follows it, not the word it also is) as UNSAID."""
    roots = {str(repository), os.path.abspath(repository), str(Path(repository).resolve())}
    for root in sorted(roots, key=len, reverse=True):
        alone = "" if root.startswith("/") else "(?!)"  # a relative root: never alone
        name = r"(?<![\w.~/-])" + re.escape(root.rstrip("/"))
        end = r"(?!" + _PATH_CHARS + ")"
        text = re.sub(r"\s*\(" + name + r"(?:/" + _PATH_CHARS + r"*)?\)", "", text)
        text = re.sub(name + r"(?:/(?P<rest>" + _PATH_CHARS + r"+)|" + alone + end + ")",
                      _as_repository_names, text)
    for other in sorted({str(o).rstrip("/") for o in others}, key=len, reverse=True):
        alone = "" if other.startswith("/") else "(?!)"
        text = re.sub(r"(?<![\w.~/-])" + re.escape(other) + r"(?:/" + _PATH_CHARS + r"+|" +
                      alone + r"(?!" + _PATH_CHARS + "))", UNSAID, text)
    return _OTHER_PATHS.sub(UNSAID, text)


def _as_repository_names(match: re.Match[str]) -> str:
    """A path under the model repository as its documented layout names it (`<model>/
    <version>/<file>`); its own hidden folders (staging, the journal) are not that layout."""
    rest = match.group("rest")
    return UNSAID if not rest or rest.startswith(".") else rest
