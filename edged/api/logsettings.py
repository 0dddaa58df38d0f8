"""Triton's logging extension (`GET/POST /v2/logging`) on Python's logging: the root logger's
level read as Triton's switches, and a request's switches applied to it. Log files and
formats belong to systemd's journal here, so only their current values are accepted."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from edged.core.errors import InvalidInput

SWITCHES = ("log_info", "log_warning", "log_error")


def current(root: logging.Logger | None = None) -> dict[str, Any]:
    level = (root or logging.getLogger()).getEffectiveLevel()
    return {"log_file": "", "log_info": level <= logging.INFO,
            "log_warning": level <= logging.WARNING, "log_error": level <= logging.ERROR,
            "log_verbose_level": 1 if level <= logging.DEBUG else 0, "log_format": "default"}


def apply(changes: Mapping[str, Any], root: logging.Logger | None = None) -> dict[str, Any]:
    """Set the root logger's level from Triton's switches (the lowest level any of them
    enables); returns the settings now in force. InvalidInput for an unknown key or value."""
    root = root or logging.getLogger()
    settings = current(root)
    for key, value in changes.items():
        if key not in settings:
            raise InvalidInput(f"logging: unknown setting {key!r} (known: "
                               f"{', '.join(settings)})")
        if key in SWITCHES and not isinstance(value, bool):
            raise InvalidInput(f"logging: {key} must be true or false")
        if key == "log_verbose_level" and (not isinstance(value, int) or isinstance(value, bool)
                                           or value < 0):
            raise InvalidInput("logging: log_verbose_level must be an integer >= 0")
        if key == "log_file" and value != "":
            raise InvalidInput("logging: edged logs to the journal or stderr; log_file cannot "
                               "be set")
        if key == "log_format" and value not in ("default", "ISO8601"):
            raise InvalidInput("logging: log_format must be default or ISO8601")
        settings[key] = value
    if settings["log_verbose_level"] > 0:
        level = logging.DEBUG
    elif settings["log_info"]:
        level = logging.INFO
    elif settings["log_warning"]:
        level = logging.WARNING
    elif settings["log_error"]:
        level = logging.ERROR
    else:
        level = logging.CRITICAL
    root.setLevel(level)
    return current(root)
