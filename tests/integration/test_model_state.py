"""The retained model states on the broker follow the daemon: READY once a model is warm, and
UNAVAILABLE (reason: edged stopped) after a clean shutdown, so a dashboard never shows a
stopped device's models as ready."""

from __future__ import annotations

import json

from support.broker import Broker, Subscriber
from support.daemon import ServeFactory

TOPIC = "t/state/models/tiny_cls/state"


def test_daemon_when_stopped_cleanly_leaves_its_model_states_unavailable_on_the_broker(
        broker: Broker, make_served: ServeFactory) -> None:
    sub = Subscriber(broker, TOPIC)
    try:
        served = make_served(cache="preload: [tiny_cls]",
                             mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: t/state, "
                                  "stats_interval_s: 0.2")
        sub.collect(TOPIC, until=lambda got: any(json.loads(m.payload)["state"] == "READY"
                                                 for m in got), timeout=20, what="READY")
        served.daemon.request_stop()
        assert served.daemon.stopped_event.wait(30)
    finally:
        sub.close()
    late = Subscriber(broker, TOPIC)  # joins after the stop: sees what the broker retained
    try:
        retained = late.wait_for(TOPIC)
    finally:
        late.close()
    assert retained.retain
    assert json.loads(retained.payload) == {"model": "tiny_cls", "version": 1,
                                            "state": "UNAVAILABLE", "backend": None,
                                            "providers": [], "reason": "edged stopped"}
