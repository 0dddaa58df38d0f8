"""Parameter sets in Annex B access units: found for H.264 and H.265, each distinct one once
(RTP depayloaders repeat them), none in length-prefixed (MP4) samples."""

from __future__ import annotations

from edged.sources.paramsets import parameter_sets

SPS, PPS, IDR = b"\x67\x64\x00\x0b\xac", b"\x68\xef\x8f", b"\x65\x88\x84"
VPS, HSPS, HPPS, HIDR = b"\x40\x01\x0c", b"\x42\x01\x01", b"\x44\x01\xc1", b"\x26\x01\xaf"


def annexb(*units: bytes) -> bytes:
    return b"".join(b"\x00\x00\x00\x01" + u for u in units)


def test_parameter_sets_when_h264_repeats_them_gives_each_once() -> None:
    once = parameter_sets(annexb(SPS, PPS, IDR), "h264")
    assert once == parameter_sets(annexb(SPS, PPS, SPS, PPS, IDR), "h264")
    assert once is not None and SPS in once and PPS in once and IDR not in once
    assert parameter_sets(annexb(IDR), "h264") is None
    assert parameter_sets(annexb(SPS + b"\x01", PPS, IDR), "h264") != once  # a new one


def test_parameter_sets_when_h265_finds_vps_sps_pps() -> None:
    sets = parameter_sets(b"\x00\x00\x01" + VPS + annexb(HSPS, HPPS, HIDR), "hevc")
    assert sets is not None and all(u in sets for u in (VPS, HSPS, HPPS)) and HIDR not in sets


def test_parameter_sets_when_samples_are_length_prefixed_gives_none() -> None:
    assert parameter_sets(b"\x00\x00\x00\x05" + SPS + b"\x00\x00\x00\x03" + IDR, "h264") is None
