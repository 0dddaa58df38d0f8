"""The events room: one stream's detections become objects with ids (`track.py`), which are in
zones and cross lines (`zones.py`), live through new/update/end (`lifecycle.py`), keep their best
frame as a JPEG (`snapshot.py`, stored by `store.py`), carry their licence plate voted over
their frames (`plates.py`), all driven frame by frame by
`StreamEvents` (`engine.py`). It knows nothing of MQTT, the socket or the pipeline: it takes a
frame's detections and returns what changed; `publish.py` maps that to topics through a publish
callable it is given, and `discovery.py` writes Home Assistant's configs (the daemon runs them:
`edged/streams/events_stage.py`). (Kept import-free: `edged.config` imports
`edged.events.config` without pulling in OpenCV.)"""
