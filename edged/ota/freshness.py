"""The freshness rule every OTA message (manifest or rollback command) passes before it acts,
so that a signed message can act once, where it was meant to, while it is current.

Three signed fields carry it: `target`, the topic root the message is for (a device prefix,
the fleet prefix or `<fleet_prefix>/groups/<group>`), which must be the root it arrived on;
`expires`, Unix seconds after which it is refused (and at most MAX_LIFETIME_S ahead); `seq`, an
integer the signer increases, one sequence per model shared by manifests and commands: the
device keeps the highest seq it accepted per model (InstallJournal) and refuses one not
greater. The same manifest again (same seq and signature, e.g. a retained manifest re-sent
at a reconnect, or a QoS 1 duplicate) is not a replay of an older one: it goes on to the
usual "already serving" check, as installing a version is idempotent. A command is not (each
rollback goes one version further back), so the same command again is refused. A message
without the three fields is refused as `stale` unless ota.allow_unsigned (which gives up
authenticity, and with it freshness).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edged.ota.manifest import Rejected

FIELDS = ("target", "seq", "expires")
# The target of a manifest handed over on the socket API (edged.ota.local: the Mender module)
# rather than published on a topic root.
LOCAL_ROOT = "local"
MAX_LIFETIME_S = 31 * 24 * 3600  # a signed message is good for a month at most
MAX_JSON_INT = 2 ** 53 - 1  # what RFC 8785 (IEEE doubles) can carry exactly


@dataclass(frozen=True)
class Freshness:
    target: str
    seq: int
    expires: int
    digest: str  # of the signature: tells "the same message again" from a replay of an older


def read_freshness(document: Mapping[str, Any], bad: str) -> Freshness | None:
    """The freshness fields of `document` (None when none is given), or Rejected(`bad`) when
    they are malformed, or Rejected('stale') when only some are given."""
    given: dict[str, Any] = {k: document[k] for k in FIELDS if document.get(k) is not None}
    if not given:
        return None
    if len(given) < len(FIELDS):
        missing = ", ".join(k for k in FIELDS if k not in given)
        raise Rejected("stale", f"no {missing}: a signed message carries target, seq and "
                                "expires (sign it again with a current `edged ota`)")
    target, seq, expires = given["target"], given["seq"], given["expires"]
    if not isinstance(target, str) or not target or len(target) > 1024:
        raise Rejected(bad, "target must be a topic root such as edged/edge-01")
    for key, value in (("seq", seq), ("expires", expires)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_JSON_INT:
            raise Rejected(bad, f"{key} must be an integer from 1 to 2^53-1, got {value!r:.40}")
    signature = str(document.get("signature", ""))
    return Freshness(target, int(seq), int(expires),
                     hashlib.sha256(signature.encode()).hexdigest()[:32])


def check_fresh(document: Mapping[str, Any], *, root: str, accepted: tuple[int, str] | None,
                allow_unsigned: bool, bad: str, idempotent: bool,
                now: float | None = None) -> Freshness | None:
    """Refuse `document`, which arrived on topic root `root`, unless it is fresh: Rejected with
    reason stale, wrong_target, expired or replayed (`bad` when malformed). `accepted` is the
    (seq, digest) last accepted for its model; `idempotent`: the last accepted message itself
    may come again (manifests, not commands). Returns its Freshness (None: unsigned and
    allowed, without the fields), for the caller to record once it acts on it."""
    fresh = read_freshness(document, bad)
    if fresh is None:
        if allow_unsigned:
            return None
        raise Rejected("stale", "no target, seq and expires: a message without them could be "
                                "replayed forever (sign it again with a current `edged ota`)")
    if fresh.target != root:
        raise Rejected("wrong_target", f"signed for {fresh.target!r}, arrived on {root!r}")
    now = time.time() if now is None else now
    if now > fresh.expires:
        raise Rejected("expired", f"expired {now - fresh.expires:.0f} s ago")
    if fresh.expires > now + MAX_LIFETIME_S:
        raise Rejected("expired", f"expires more than {MAX_LIFETIME_S // 86400} days ahead; "
                                  "sign messages with a shorter --ttl")
    if accepted is not None:
        seq, digest = accepted
        if fresh.seq < seq or (fresh.seq == seq and not (idempotent and fresh.digest == digest)):
            raise Rejected("replayed", f"seq {fresh.seq} is not above {seq}, the last this "
                                       "device accepted for the model")
    return fresh
