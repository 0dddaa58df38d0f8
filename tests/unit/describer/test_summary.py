"""The review summary's schema and edged's own validator: the published file is the schema
the code holds, and the validator agrees with the jsonschema package on answers good and bad."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from edged.describer.askers import LOCAL_SCHEMA
from edged.describer.summary import SCHEMA, SchemaMismatch, parse_answer, validate

PUBLISHED = Path(__file__).parents[3] / "docs" / "schemas" / "review-summary.schema.json"
GOOD: dict[str, Any] = {"title": "Person at the door", "scene": "A person walks to the door.",
                        "shortSummary": "A person came to the door. They left.",
                        "confidence": 0.7, "potential_threat_level": 0}
BAD: list[tuple[str, Any]] = [
    ("title", ""), ("title", "x" * 81), ("title", 3), ("scene", None),
    ("shortSummary", "y" * 161), ("confidence", 1.5), ("confidence", -0.1),
    ("confidence", "high"), ("confidence", True), ("potential_threat_level", 3),
    ("potential_threat_level", 1.5), ("potential_threat_level", "0"),
    ("other_concerns", "loitering"), ("other_concerns", [""]), ("other_concerns", [1]),
    ("other_concerns", ["a"] * 9), ("time", 5)]


def test_published_schema_when_read_is_the_schema_the_code_validates_with() -> None:
    assert json.loads(PUBLISHED.read_text()) == SCHEMA
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_parse_answer_when_valid_returns_the_summary() -> None:
    answer = {**GOOD, "other_concerns": ["a ladder"], "time": "10:00"}
    assert parse_answer(json.dumps(answer)) == answer
    jsonschema.validate(answer, SCHEMA)


def test_parse_answer_when_fenced_in_markdown_reads_the_json_inside() -> None:
    assert parse_answer("```json\n" + json.dumps(GOOD) + "\n```") == GOOD


def test_parse_answer_when_a_string_holds_a_raw_newline_reads_it() -> None:
    text = json.dumps(GOOD).replace("A person walks", "A person\nwalks")
    assert "\n" in text and parse_answer(text)["scene"] == "A person\nwalks to the door."


def test_parse_answer_when_keys_frigate_lacks_come_drops_them() -> None:
    assert parse_answer(json.dumps({**GOOD, "action": "walking", "observations": []})) == GOOD


def test_parse_answer_when_integer_threat_is_written_as_float_accepts_it() -> None:
    assert parse_answer(json.dumps({**GOOD, "potential_threat_level": 1.0}))[
        "potential_threat_level"] == 1.0


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '"text"', '{"title": "cut',
                                  "null"])
def test_parse_answer_when_not_an_object_raises_schema_mismatch(text: str) -> None:
    with pytest.raises(SchemaMismatch):
        parse_answer(text)


@pytest.mark.parametrize(("key", "value"), BAD)
def test_validate_when_a_field_is_wrong_agrees_with_jsonschema(key: str, value: Any) -> None:
    answer = {**GOOD, key: value}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(answer, SCHEMA)
    with pytest.raises(SchemaMismatch, match=key):
        validate(answer, SCHEMA)


@pytest.mark.parametrize("missing", ["title", "scene", "shortSummary", "confidence",
                                     "potential_threat_level"])
def test_validate_when_a_required_field_is_missing_names_it(missing: str) -> None:
    answer = {k: v for k, v in GOOD.items() if k != missing}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(answer, SCHEMA)
    with pytest.raises(SchemaMismatch, match=f"{missing} is missing"):
        validate(answer, SCHEMA)


def test_local_schema_when_compared_allows_only_what_the_schema_allows() -> None:
    """The local model's grammar is the schema, tightened: nothing it lets through fails."""
    local, full = LOCAL_SCHEMA["properties"], SCHEMA["properties"]
    assert set(local) <= set(full) and LOCAL_SCHEMA["required"] == SCHEMA["required"]
    for key, spec in local.items():
        for bound in ("maxLength", "maxItems", "maximum"):
            if bound in full[key]:
                assert spec[bound] <= full[key][bound], (key, bound)
        for bound in ("minLength", "minimum"):
            if bound in full[key]:
                assert spec[bound] >= full[key][bound], (key, bound)
    assert local["other_concerns"]["items"]["maxLength"] <= \
        full["other_concerns"]["items"]["maxLength"]
