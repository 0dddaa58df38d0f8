"""Secrets named in the config (MQTT password, OTA trusted keys): where the file really is.
systemd hands them to the service in $CREDENTIALS_DIRECTORY (LoadCredential=), so a relative
path in the config is read from there."""

from __future__ import annotations

import os
from pathlib import Path


def credential(path: Path) -> Path:
    """Where a secret named in the config lives: a relative path is looked up in systemd's
    $CREDENTIALS_DIRECTORY (LoadCredential=), so secrets never sit in the config or in a
    directory the service can read when it is not running; an absolute path is used as is."""
    if not path.is_absolute():
        credentials = os.environ.get("CREDENTIALS_DIRECTORY")
        if credentials:
            return Path(credentials) / path
    return path
