"""Frigate's review summary (`frigate/data_processing/post/types.py`, `ReviewMetadata`), as a
JSON Schema, and the small validator edged checks every answer with (the daemon does not
depend on the jsonschema package; tests hold this one against it on the published file,
`docs/schemas/review-summary.schema.json`, which must equal `SCHEMA`).

Frigate's field names and types: `title`, `scene`, `shortSummary` (camelCase, as Frigate has
it), `confidence` (0..1), `potential_threat_level` (0 normal, 1 suspicious, 2 critical),
`other_concerns` (list of strings, optional), `time` (optional). Its minimum lengths (a
150-character scene) are prompting aids for large VLMs; here strings need one character and
have Frigate's maximums (longer, for the 80-character title's companions), so a small model's
honest short answer is valid and a runaway one is not. Keys Frigate does not have are dropped
before validation, as Frigate's own model ignores them (`extra="ignore"`)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://edged.example/schemas/review-summary.schema.json",
    "title": "review summary",
    "description": "What a describer answers about one ended event: Frigate's GenAI review "
                   "summary (ReviewMetadata). Keys other than these are dropped before "
                   "validation.",
    "type": "object",
    "required": ["title", "scene", "shortSummary", "confidence", "potential_threat_level"],
    "additionalProperties": False,
    "properties": {
        "title": {"type": "string", "minLength": 1, "maxLength": 80,
                  "description": "under 10 words: the activity and where"},
        "scene": {"type": "string", "minLength": 1, "maxLength": 600,
                  "description": "what happens from start to finish"},
        "shortSummary": {"type": "string", "minLength": 1, "maxLength": 160,
                         "description": "two sentences, for notifications"},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1,
                       "description": "0 = none, 1 = complete"},
        "potential_threat_level": {"type": "integer", "minimum": 0, "maximum": 2,
                                   "description": "0 normal, 1 suspicious, 2 critical"},
        "other_concerns": {"type": "array", "maxItems": 8,
                           "items": {"type": "string", "minLength": 1, "maxLength": 200},
                           "description": "the site's concerns that were observed"},
        "time": {"type": "string", "maxLength": 64, "description": "time of the activity"},
    },
}
FIELDS = tuple(SCHEMA["properties"])
_TYPES: dict[str, type | tuple[type, ...]] = {"string": str, "object": dict, "array": list,
                                              "boolean": bool, "null": type(None)}


class SchemaMismatch(ValueError):
    """An answer that is not a review summary: what is wrong, with its JSON path."""


def parse_answer(text: str) -> dict[str, Any]:
    """A model's answer as a review summary: the JSON object in `text` (a Markdown code
    fence around it is allowed, as chat models add one), unknown keys dropped, validated.
    Raises SchemaMismatch saying why not."""
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0]
    try:  # (strict=False: a raw newline or tab inside a string, as small models write it)
        value = json.loads(body, strict=False)
    except json.JSONDecodeError as exc:
        raise SchemaMismatch(f"not JSON: {exc.msg} at character {exc.pos}") from exc
    if not isinstance(value, dict):
        raise SchemaMismatch(f"$: expected an object, got {_kind(value)}")
    summary = {key: value[key] for key in FIELDS if key in value}
    validate(summary, SCHEMA)
    return summary


def validate(value: Any, schema: Mapping[str, Any], path: str = "$") -> None:
    """JSON Schema's keywords that SCHEMA uses (type, required, properties,
    additionalProperties, items, min/maxItems, min/maxLength, minimum/maximum, enum);
    raises SchemaMismatch at the first failure."""
    kind = schema.get("type")
    if kind is not None and not _is(value, kind):
        raise SchemaMismatch(f"{path}: expected {kind}, got {_kind(value)}")
    if "enum" in schema and value not in schema["enum"]:
        raise SchemaMismatch(f"{path}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            raise SchemaMismatch(f"{path}: shorter than {schema['minLength']} characters")
        if len(value) > schema.get("maxLength", math.inf):
            raise SchemaMismatch(f"{path}: longer than {schema['maxLength']} characters")
    if _is(value, "number"):
        if value < schema.get("minimum", -math.inf):
            raise SchemaMismatch(f"{path}: {value} is below {schema['minimum']}")
        if value > schema.get("maximum", math.inf):
            raise SchemaMismatch(f"{path}: {value} is above {schema['maximum']}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            raise SchemaMismatch(f"{path}: fewer than {schema['minItems']} items")
        if len(value) > schema.get("maxItems", math.inf):
            raise SchemaMismatch(f"{path}: more than {schema['maxItems']} items")
        items = schema.get("items")
        if items is not None:
            for i, item in enumerate(value):
                validate(item, items, f"{path}[{i}]")
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                raise SchemaMismatch(f"{path}: {key} is missing")
        properties = schema.get("properties", {})
        for key, item in value.items():
            if key in properties:
                validate(item, properties[key], f"{path}.{key}")
            elif schema.get("additionalProperties", True) is False:
                raise SchemaMismatch(f"{path}: {key} is not allowed")


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":  # JSON's 2.0 is an integer too
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and \
            math.isfinite(value)
    return isinstance(value, _TYPES[kind])

def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")
