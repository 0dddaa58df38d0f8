"""A reload (SIGHUP) that turns a stream's recording on opens the recording folder (none was
open: no stream recorded at start) and the stream records from then on; one that turns it off
restarts the stream without it. The real daemon, grid_det on the crossing squares (a file
played in a loop), ffprobe on what it wrote."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from support.daemon import ServeFactory
from support.polling import wait_until
from support.video import crossing_h264, ffprobe

from edged.config import DaemonConfig
from edged.recording.config import ClipsConfig, RecordConfig
from tools.assets import models as test_models


@pytest.fixture
def crossing(repo_dir: Path, tmp_path: Path) -> Path:
    test_models.write_repository(repo_dir, names=["grid_det"])
    return crossing_h264(tmp_path, fps=10)


def test_reload_when_it_turns_recording_on_and_off_takes_effect_without_a_restart(
        make_served: ServeFactory, crossing: Path) -> None:
    new: list[DaemonConfig] = []
    served = make_served(
        cache="preload: [grid_det]", recording="min_free_mb: 0",
        streams=f"[{{name: door, source: 'file://{crossing}', model: grid_det, "
                "labels: [red, blue], loop: true}]", reload_config=lambda: new[-1])
    daemon = served.daemon
    assert daemon.clips is None  # nothing recorded at start: no folder opened
    plain = daemon.config
    door = plain.streams[0]
    recording = dataclasses.replace(door, record=RecordConfig(enabled=True, segment_s=1.0),
                                    clips=ClipsConfig(enabled=True, pre_capture_s=1.0,
                                                      post_capture_s=0.5))
    new.append(dataclasses.replace(plain, streams=[recording]))
    daemon.request_reload_threadsafe()
    wait_until(lambda: daemon.reloads["ok"] == 1, timeout=30, what="the first reload")
    store = daemon.clips
    assert store is not None and store.root == plain.recording.dir
    segments = wait_until(lambda: store.list(kind="segment")[1:], timeout=60,
                          what="segments recorded after the reload")
    probe = ffprobe(store.path(segments[0]))
    assert probe["frames"][0]["key_frame"] == 1 and len(probe["frames"]) == segments[0].packets
    wait_until(lambda: store.list(kind="clip"), timeout=60, what="an event clip")
    with served.client() as client:
        status, _, _ = client.request("GET", f"/v2/edged/clips/{segments[0].id}")
        assert status == 200

    new.append(dataclasses.replace(plain, streams=[door]))  # off again
    daemon.request_reload_threadsafe()
    wait_until(lambda: daemon.reloads["ok"] == 2, timeout=30, what="the second reload")
    [pipeline] = daemon.pipelines
    assert pipeline.cfg == door and getattr(pipeline.source, "sink", None) is None
    kept = len(store.list())
    processed = pipeline.read_stats().processed
    wait_until(lambda: pipeline.read_stats().processed >= processed + 30, timeout=30,
               what="frames through the model after recording went off")
    assert len(store.list()) == kept, "nothing is recorded once it is off"
