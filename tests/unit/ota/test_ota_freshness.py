"""The freshness rule (edged/ota/freshness.py) and the signed form: which messages may act,
judged from their fields, the topic root they came on and the last seq the device accepted;
and the RFC 8785 bytes a signer in another language must reproduce."""

from __future__ import annotations

from typing import Any

import pytest

from edged.ota.freshness import MAX_LIFETIME_S, check_fresh, read_freshness
from edged.ota.manifest import Rejected, canonical_bytes, parse_command

NOW = 1_800_000_000.0
ROOT = "edged/edge-01"


def message(**changes: Any) -> dict[str, Any]:
    doc = {"model": "cls", "action": "rollback", "target": ROOT, "seq": 10,
           "expires": int(NOW) + 60, "signature": "c2ln"}
    doc.update(changes)
    return {k: v for k, v in doc.items() if v is not None}


def check(doc: dict[str, Any], accepted: tuple[int, str] | None = None, *,
          idempotent: bool = True, allow_unsigned: bool = False, root: str = ROOT) -> Any:
    return check_fresh(doc, root=root, accepted=accepted, allow_unsigned=allow_unsigned,
                       bad="bad_command", idempotent=idempotent, now=NOW)


@pytest.mark.parametrize(("doc", "root", "accepted", "reason"), [
    (message(target=None, seq=None, expires=None), ROOT, None, "stale"),
    (message(seq=None), ROOT, None, "stale"),
    (message(), "edged/fleet", None, "wrong_target"),
    (message(target="edged/edge-01/"), ROOT, None, "wrong_target"),
    (message(expires=int(NOW) - 1), ROOT, None, "expired"),
    (message(expires=int(NOW) + MAX_LIFETIME_S + 10), ROOT, None, "expired"),
    (message(seq=9), ROOT, (10, "x"), "replayed"),
    (message(seq="11"), ROOT, None, "bad_command"),
    (message(seq=2 ** 53), ROOT, None, "bad_command"),
], ids=["no-fields", "no-seq", "other-root", "other-spelling", "expired", "too-long-lived",
        "lower-seq", "seq-string", "seq-beyond-2^53"])
def test_freshness_when_a_message_is_not_fresh_refuses_it_with_its_reason(
        doc: dict[str, Any], root: str, accepted: tuple[int, str] | None, reason: str) -> None:
    with pytest.raises(Rejected) as info:
        check(doc, accepted, root=root)
    assert info.value.reason == reason


def test_freshness_when_the_same_message_comes_again_allows_it_only_where_idempotent() -> None:
    doc = message()
    fresh = check(doc)
    assert (fresh.target, fresh.seq) == (ROOT, 10)
    same = (fresh.seq, fresh.digest)
    assert check(doc, same, idempotent=True) == fresh  # a retained manifest seen again
    with pytest.raises(Rejected, match="replayed"):  # a command would act twice
        check(doc, same, idempotent=False)
    with pytest.raises(Rejected, match="replayed"):  # another message with that seq
        check(message(signature="b3RoZXI="), same)
    assert check(message(seq=11), same).seq == 11


def test_freshness_when_unsigned_is_allowed_takes_messages_without_the_fields() -> None:
    assert check(message(target=None, seq=None, expires=None), allow_unsigned=True) is None
    with pytest.raises(Rejected, match="wrong_target"):  # fields given are still checked
        check(message(), allow_unsigned=True, root="edged/fleet")
    assert read_freshness(message(target=None, seq=None, expires=None), "bad_command") is None


def test_canonical_bytes_when_signed_are_rfc8785() -> None:
    doc = {"z": [1, 2.5, 1e21], "é": "\u2028\n", "a": {"c": True, "b": None},
           "signature": "left out"}
    assert canonical_bytes(doc) == ('{"a":{"b":null,"c":true},"z":[1,2.5,1e+21],'
                                    '"é":"\u2028\\n"}').encode()
    with pytest.raises(Rejected, match="bad_manifest"):  # JCS numbers are doubles
        canonical_bytes({"seq": 2 ** 60})


@pytest.mark.parametrize("payload", [
    b'{"model": "cls", "action": "rollback", "extra": 1}',
    b'{"model": "cls", "action": "delete"}',
    b'{"model": "cls", "action": "rollback", "from_version": 0}',
    b'{"model": "cls", "action": "rollback", "seq": true}',
    b'[1]', b'{"model": "cls", "action": "rollback", "expires": NaN}',
    b'{"model": "cls", "action": "rollback"}' + b" " * 5000,
])
def test_command_when_malformed_or_oversized_is_a_bad_command(payload: bytes) -> None:
    with pytest.raises(Rejected) as info:
        parse_command(payload)
    assert info.value.reason == "bad_command"
