"""The change gate alone: what it lets through to the model (the first frame, a frame whose
picture changed, a frame after `max_skip_s`, after a reset, for a new model version or frame
size) and what it holds back (sensor noise and JPEG, a change below the threshold until it
adds up); when a stream gates at all; its config keys and their errors."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edged.config import parse_config
from edged.core.errors import ConfigError
from edged.streams.config import GateConfig
from edged.streams.gate import ChangeGate, thumbnail, wanted

H, W = 480, 640


def scene(seed: int = 0) -> np.ndarray:
    """A textured 640x480 picture (a camera's view of gravel, say)."""
    rng = np.random.default_rng(seed)
    small = rng.integers(40, 200, (H // 8, W // 8, 3), np.uint8)
    return cv2.resize(small, (W, H), interpolation=cv2.INTER_LINEAR)


def seen(picture: np.ndarray, rng: np.random.Generator, noise: float = 3.0) -> np.ndarray:
    """The picture as a camera delivers it: sensor noise, then JPEG."""
    noisy = np.clip(picture + rng.normal(0.0, noise, picture.shape), 0, 255).astype(np.uint8)
    ok, data = cv2.imencode(".jpg", noisy, [cv2.IMWRITE_JPEG_QUALITY, 85])
    assert ok
    return cv2.imdecode(data, cv2.IMREAD_COLOR)


def with_square(picture: np.ndarray, x: int, y: int, side: int = 24) -> np.ndarray:
    """A dark square on the picture (someone in a dark coat)."""
    out = picture.copy()
    out[y:y + side, x:x + side] = (20, 20, 20)
    return out


def test_gate_when_the_first_frame_comes_admits_it() -> None:
    assert ChangeGate(GateConfig()).admit(scene(), 0.0)


@pytest.mark.parametrize("noise", [2.0, 4.0, 8.0])
def test_gate_when_frames_differ_only_by_sensor_noise_and_jpeg_holds_them(noise: float) -> None:
    rng = np.random.default_rng(1)
    gate = ChangeGate(GateConfig())
    picture = scene()
    assert gate.admit(seen(picture, rng, noise), 0.0)
    held = [gate.admit(seen(picture, rng, noise), i * 0.1) for i in range(1, 19)]
    assert not any(held)
    assert gate.last_change <= GateConfig().threshold


def test_gate_when_a_small_object_moves_a_few_pixels_admits_the_frame() -> None:
    """A 24 px square (a person far off) stepping 6 px: each step goes to the model."""
    rng = np.random.default_rng(2)
    gate = ChangeGate(GateConfig())
    picture = scene()
    assert gate.admit(seen(with_square(picture, 100, 200), rng), 0.0)
    steps = [gate.admit(seen(with_square(picture, 100 + 6 * i, 200), rng), i * 0.1)
             for i in range(1, 6)]
    assert all(steps)


def test_gate_when_an_object_appears_at_the_edge_admits_its_first_frame() -> None:
    rng = np.random.default_rng(3)
    gate = ChangeGate(GateConfig())
    picture = scene()
    assert gate.admit(seen(picture, rng), 0.0)
    entering = picture.copy()
    entering[200:260, 0:8] = (250, 250, 250)  # 8 px of something walking in
    assert gate.admit(seen(entering, rng), 0.1)


def test_gate_when_a_change_creeps_in_admits_once_it_adds_up_since_the_model_looked() -> None:
    """Compared with the frame the model last saw, not the previous one: a square creeping a
    pixel a frame is held back only until its motion is worth a look (a sample, 2.4 px here)."""
    gate = ChangeGate(GateConfig(max_skip_s=1000))
    picture = scene()
    assert gate.admit(with_square(picture, 100, 200, side=40), 0.0)
    admitted = [gate.admit(with_square(picture, 100 + i, 200, side=40), i * 0.1)
                for i in range(1, 31)]
    assert not admitted[0]  # one pixel: held
    assert 10 <= sum(admitted) < 30  # every 1-3 px, never more than 3 px behind
    assert all(any(admitted[i:i + 3]) for i in range(0, 28))


def test_gate_when_max_skip_s_passes_admits_an_unchanged_frame() -> None:
    gate = ChangeGate(GateConfig(max_skip_s=2.0))
    picture = scene()
    assert gate.admit(picture, 10.0)
    assert not gate.admit(picture, 11.9)
    assert gate.admit(picture, 12.0)  # at least every 2 s of capture time
    assert not gate.admit(picture, 13.0)


def test_gate_when_capture_time_goes_back_admits_the_frame() -> None:
    gate = ChangeGate(GateConfig())
    assert gate.admit(scene(), 10.0)
    assert gate.admit(scene(), 5.0)


def test_gate_when_reset_after_a_failed_inference_admits_the_next_frame() -> None:
    gate = ChangeGate(GateConfig())
    picture = scene()
    assert gate.admit(picture, 0.0, ("det", 1))
    assert not gate.admit(picture, 0.1, ("det", 1))
    gate.reset()
    assert gate.admit(picture, 0.2, ("det", 1))


def test_gate_when_a_new_model_version_answers_admits_the_next_frame() -> None:
    gate = ChangeGate(GateConfig())
    picture = scene()
    assert gate.admit(picture, 0.0, ("det", 1))
    assert gate.admit(picture, 0.1, ("det", 2))
    assert not gate.admit(picture, 0.2, ("det", 2))


def test_gate_when_the_frame_size_changes_admits_the_frame() -> None:
    gate = ChangeGate(GateConfig())
    assert gate.admit(scene(), 0.0)
    assert gate.admit(cv2.resize(scene(), (320, 240)), 0.1)  # the camera came back smaller


def test_thumbnail_when_frames_are_colour_grey_or_bgra_is_grey_at_the_height_asked() -> None:
    picture = scene()
    for frame in (picture, cv2.cvtColor(picture, cv2.COLOR_BGR2GRAY),
                  cv2.cvtColor(picture, cv2.COLOR_BGR2BGRA)):
        thumb = thumbnail(frame, 100)
        assert thumb.shape == (100, 133) and thumb.dtype == np.uint8
    assert thumbnail(picture[:60, :80], 100).shape == (60, 80)  # never larger than the frame


@pytest.mark.parametrize(("enabled", "tracking", "frames", "pictures", "gated"), [
    ("auto", True, False, True, True),  # the default detect stream: events, no frame results
    ("auto", True, True, True, False),  # every frame's results were asked for
    ("auto", False, True, True, False),  # classify and raw streams
    ("auto", True, False, False, False),  # (sensors have no pictures)
    (True, False, True, True, True),  # asked for on a classify stream
    (True, True, False, False, False),
    (False, True, False, True, False),
])
def test_wanted_when_enabled_is_auto_gates_detect_streams_that_track(
        enabled: object, tracking: bool, frames: bool, pictures: bool, gated: bool) -> None:
    cfg = GateConfig(enabled=enabled)  # type: ignore[arg-type]
    assert wanted(cfg, tracking=tracking, frames=frames, pictures=pictures) is gated


def test_config_when_gate_keys_are_given_reads_them() -> None:
    config = parse_config("streams:\n  - {name: door, source: 'rtsp://cam/1', model: det,\n"
                          "     gate: {enabled: true, threshold: 0.002, pixel_threshold: 20,\n"
                          "            max_skip_s: 5, height: 72}}\n")
    assert config.streams[0].gate == GateConfig(True, 0.002, 20, 5.0, 72)
    assert parse_config("streams: [{name: d, source: 'rtsp://c', model: m}]"
                        ).streams[0].gate.enabled == "auto"


@pytest.mark.parametrize(("gate", "message"), [
    ("{enabled: maybe}", "streams[0].gate.enabled: expected one of 'auto', True, False"),
    ("{threshold: 2}", "streams[0].gate.threshold"),
    ("{pixel_threshold: 0}", "streams[0].gate.pixel_threshold"),
    ("{max_skip_s: -1}", "streams[0].gate.max_skip_s"),
    ("{sensitivity: 3}", "streams[0].gate.sensitivity"),
])
def test_config_when_a_gate_key_is_wrong_names_it(gate: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"streams:\n  - {{name: door, source: 'rtsp://c', model: det, "
                     f"gate: {gate}}}\n")
    assert message in str(caught.value)


def test_config_when_a_sensor_stream_asks_for_a_gate_refuses_it() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config("streams:\n  - {name: vib, source: 'mqtt://plant/vib', model: anomaly,\n"
                     "     gate: {enabled: true}}\n")
    assert "streams[0].gate.enabled: a change gate measures pictures" in str(caught.value)
