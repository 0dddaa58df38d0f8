"""The events stage hands each ended object to the describer (when its stream asks): its end's
data, its best snapshot, its path and the lines it crossed; a stream without
`describe.enabled` hands nothing."""

from __future__ import annotations

import dataclasses

import numpy as np
from support.events import T0, det, stream

from edged.describer.config import StreamDescribeConfig
from edged.describer.prompt import Subject
from edged.events.publish import EventPublisher
from edged.processing.detections import Detections
from edged.streams.events_stage import EventsStage


def run(describe: StreamDescribeConfig) -> list[tuple[Subject, StreamDescribeConfig]]:
    handed: list[tuple[Subject, StreamDescribeConfig]] = []
    cfg = dataclasses.replace(stream("track: {min_hits: 2, max_age_s: 1.0}\nlabels: [person]\n"
                                     "lines: [{name: gate, points: [[250, 480], [250, 0]]}]"),
                              describe=describe)
    stage = EventsStage(cfg, EventPublisher("door", None, None),
                        describe=lambda s, c: handed.append((s, c)) is None)
    frame = np.zeros((480, 640, 3), np.uint8)
    for i in range(8):
        found = Detections.from_rows([det((100 + 20 * i, 100, 160 + 20 * i, 200))])
        stage.frame(T0 + i * 0.5, found, frame)
    stage.close()  # the stream stops: its object ends
    return handed


def test_stage_when_an_object_ends_hands_its_data_snapshot_and_path_to_the_describer(
        ) -> None:
    [(subject, settings)] = run(StreamDescribeConfig(enabled=True, per_minute=2))
    assert settings.enabled and settings.per_minute == 2
    assert subject.stream == "door" and subject.label == "person"
    assert subject.event["end_time"] is not None and subject.object_id == subject.event["id"]
    assert subject.jpeg is not None and subject.jpeg.startswith(b"\xff\xd8")
    assert len(subject.path) >= 3 and subject.path[0][0] == 0.0
    assert subject.path[-1][1] > subject.path[0][1]  # it walked rightwards
    assert subject.crossings == (("gate", "in"),)  # drawn upwards: rightwards is in


def test_stage_when_the_stream_does_not_ask_hands_nothing() -> None:
    assert run(StreamDescribeConfig()) == []
