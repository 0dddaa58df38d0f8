"""Ask an edged device for an inference over MQTT 5 (mqtt.requests in its edged.yaml): the demo
model `colors` on a red image, the request body built and the answer read by Triton's own
client library, the request's response topic one the device's allowlist names.

    python tools/examples/mqtt_request.py --broker 127.0.0.1:1883 --device edged/edge-01 \\
        --reply replies/hmi-1/colors

needs `pip install paho-mqtt tritonclient[http] numpy`; prints the class probabilities."""

from __future__ import annotations

import argparse
import queue

import numpy as np
import paho.mqtt.client as mqtt
import tritonclient.http as triton
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

HEADER_LENGTH = "Inference-Header-Content-Length"


def ask(host: str, port: int, device: str, reply: str, timeout_s: float = 10.0) -> np.ndarray:
    red = np.zeros((1, 3, 64, 64), np.float32)
    red[:, 0] = 1.0
    image = triton.InferInput("image", list(red.shape), "FP32")
    image.set_data_from_numpy(red, binary_data=True)  # the binary form: JSON, then the bytes
    wanted = triton.InferRequestedOutput("prob", binary_data=True)
    body, json_size = triton.InferenceServerClient.generate_request_body([image], [wanted])

    answers: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.on_message = lambda _c, _u, message: answers.put(message)
    client.connect(host, port)
    client.loop_start()
    try:
        client.subscribe(reply, qos=1)  # before the request, on the same connection
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = reply
        props.CorrelationData = b"request-1"
        props.UserProperty = [(HEADER_LENGTH, str(json_size))]
        client.publish(f"{device}/infer/colors", body, qos=1, properties=props)
        message = answers.get(timeout=timeout_s)
    finally:
        client.disconnect()
        client.loop_stop()
    found = dict(message.properties.UserProperty)
    if found.get("status") != "200":
        raise RuntimeError(f"{found.get('status')}: {message.payload.decode()}")
    assert message.properties.CorrelationData == b"request-1"
    length = found.get(HEADER_LENGTH)
    result = triton.InferenceServerClient.parse_response_body(
        message.payload, header_length=int(length) if length else None)
    prob: np.ndarray = result.as_numpy("prob")
    return prob


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", default="127.0.0.1:1883", metavar="HOST:PORT")
    parser.add_argument("--device", default="edged/edge-01", help="the device's topic prefix")
    parser.add_argument("--reply", default="replies/hmi-1/colors", help="the response topic")
    args = parser.parse_args()
    host, _, port = args.broker.rpartition(":")
    prob = ask(host, int(port), args.device, args.reply)
    print("red, green, blue:", np.round(prob[0], 4).tolist())


if __name__ == "__main__":
    main()
