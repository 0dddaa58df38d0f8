"""The recording keys: a stream's `clips:` and the daemon's `recording:`, with the checks that
name the key: clips need a source the demuxing reader reads and that reader, zones the stream
has; `check-config` says when the recording folder cannot be used."""

from __future__ import annotations

from pathlib import Path

import pytest

from edged.cli import main
from edged.config import parse_config
from edged.core.errors import ConfigError
from edged.sources import chosen_reader


def stream(source: str, extra: str = "", clips: str = "enabled: true, pre_capture_s: 3") -> str:
    return (f"streams: [{{name: door, source: '{source}', model: m, "
            f"clips: {{{clips}}}{extra}}}]\n")


def test_clips_config_when_valid_reads_every_key_and_picks_the_pyav_reader() -> None:
    config = parse_config(stream("rtsp://10.0.0.5/s", ", zones: [{name: z, polygon: "
                                 "[[0, 0], [9, 0], [9, 9]]}]", "enabled: true, zones: [z], "
                                 "labels: [person], post_capture_s: 7")
                          + "recording: {dir: /data/rec, clips_mb: 500, min_free_mb: 50}\n")
    cfg = config.streams[0]
    assert cfg.clips.zones == ["z"] and cfg.clips.post_capture_s == 7
    assert config.recording.dir == Path("/data/rec") and config.recording.clips_mb == 500
    assert chosen_reader(cfg, recording=True) == "pyav"
    assert chosen_reader(cfg, recording=False) == "opencv"


@pytest.mark.parametrize(("text", "message"), [
    (stream("v4l2:///dev/video0"), "streams[0].clips.enabled: clips are recorded from "
                                   "rtsp://, http(s):// and file:// sources, not v4l2://"),
    (stream("rtsp://h/s", ", reader: opencv"), "streams[0].reader: clips need the camera's "
                                               "packets"),
    (stream("rtsp://h/s", clips="enabled: true, zones: [nowhere]"),
     "streams[0].clips.zones[0]: no zone 'nowhere' in this stream"),
    (stream("rtsp://h/s", clips="enabled: true, pre_capture_s: 61"),
     "streams[0].clips.pre_capture_s"),
    (stream("rtsp://h/s", clips="enabled: true, bogus: 1"), "streams[0].clips.bogus: "
                                                             "unknown key"),
    (stream("rtsp://h/s", ", reader: gstreamer"), "streams[0].reader"),
    ("recording: {clips_mb: 0}\n", "recording.clips_mb: must be >= 1"),
    ("streams: [{name: cam, source: 'v4l2:///dev/video0', model: m, record: {enabled: true}}]"
     "\n", "streams[0].record.enabled: clips are recorded from rtsp://"),
    ("streams: [{name: cam, source: 'rtsp://h/s', model: m, record: {enabled: true, "
     "segment_s: 0.5}}]\n", "streams[0].record.segment_s"),
    ("streams: [{name: cam, source: 'rtsp://h/s', model: m, record: {enabled: true, "
     "mode: sometimes}}]\n", "streams[0].record.mode"),
])
def test_clips_config_when_wrong_names_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    assert message in str(caught.value)


def test_check_config_when_the_recording_folder_is_a_file_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "rec"
    blocker.write_text("a file")
    config = tmp_path / "edged.yaml"
    config.write_text(f"models_dir: {tmp_path / 'none'}\n" + stream("rtsp://h/s")
                      + f"recording: {{dir: {blocker}}}\n")
    assert main(["check-config", str(config)]) == 1
    assert f"recording.dir: {blocker} is not a folder (line 3)" in capsys.readouterr().out


def test_clips_config_when_clip_labels_are_not_tracked_names_the_label() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(stream("rtsp://h/s", ", labels: [person, car]",
                            "enabled: true, labels: [person, dog]"))
    assert "streams[0].clips.labels[1]: 'dog' is not in this stream's labels (person, car)" \
        in str(caught.value)


def test_check_config_when_clip_labels_are_not_the_models_names_them(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tools.assets import models as test_models

    test_models.write_repository(tmp_path / "models", names=["grid_det"])
    config = tmp_path / "edged.yaml"
    config.write_text(f"models_dir: {tmp_path / 'models'}\n"
                      "streams: [{name: door, source: 'rtsp://h/s', model: grid_det, clips: "
                      "{enabled: true, labels: [red, cat]}}]\n"
                      f"recording: {{dir: {tmp_path / 'rec'}}}\n")
    assert main(["check-config", str(config)]) == 1
    out = capsys.readouterr().out
    assert "streams[0].clips.labels[1]: the model has no label 'cat' (red, green, blue); " \
           "the stream would not start" in out
    assert "labels[0]" not in out


def test_check_config_when_the_recording_folder_cannot_be_made_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where a folder should be")
    config = tmp_path / "edged.yaml"
    config.write_text(f"models_dir: {tmp_path / 'none'}\n" + stream("rtsp://h/s")
                      + f"recording: {{dir: {blocker / 'rec'}}}\n")
    assert main(["check-config", str(config)]) == 1
    assert f"recording.dir: {blocker / 'rec'} cannot be made" in capsys.readouterr().out
