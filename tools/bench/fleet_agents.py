"""The simulated devices of `python -m tools.bench fleet`: COUNT edged OTA agents in one
process (`python -m tools.bench.fleet_agents ...`), each the daemon's own OTA path: an
MqttLink (its retained `online` status, its QoS), the OtaService (parsing, the Ed25519
signature against a trusted key, freshness, the status events) and the Updater over a model
repository of its own (the artifact downloaded and its sha256 checked, staged, adopted, the
active pointer moved, the warm swap). Only the model is not loaded: a backend that reads the
model's specs and answers zeros stands in for ONNX Runtime, so a thousand agents fit a
two-core machine. Prints `ready N` once every agent's OTA subscriptions are confirmed, and
stops when its stdin closes."""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edged.backends import BackendOptions, LoadSpec, register_backend
from edged.backends.base import TensorSpec
from edged.inference.cache import ModelCache
from edged.model.repository import ModelRepository
from edged.mqtt.config import MqttConfig
from edged.mqtt.link import MqttLink
from edged.ota.config import OtaConfig
from edged.ota.install import Event, Updater
from edged.ota.manifest import TrustStore
from edged.ota.service import OtaService

MODEL = "tiny_cls"


class NullSession:
    nbytes = 0

    def __init__(self, spec: LoadSpec) -> None:
        self.providers = ["null"]
        self.inputs: Sequence[TensorSpec] = spec.inputs
        self.outputs: Sequence[TensorSpec] = spec.outputs

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = next(iter(inputs.values())).shape[0] if inputs else 1
        return {o.name: np.zeros([rows if d < 0 else d for d in o.shape], o.dtype)
                for o in self.outputs}

    def close(self) -> None:
        pass


class NullBackend:
    """Stands in for ONNX Runtime: the specs of the real file, nothing loaded."""

    name = "onnxruntime"

    def unavailable_reason(self) -> str | None:
        return None

    def load(self, spec: LoadSpec, options: BackendOptions) -> NullSession:
        return NullSession(spec)

    def auto_precision(self, int8: Path | None, why: str) -> tuple[str, str] | None:
        return ("fp32", "the fleet bench's null backend")


@dataclass
class Agent:
    link: MqttLink
    ota: OtaService


def make_agent(root: Path, name: str, port: int, prefix: str, fleet: str, key: Path,
               model_file: Path) -> Agent:
    models = root / name / "models"
    (models / MODEL / "1").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(model_file, models / MODEL / "1" / "model.onnx")
    repository = ModelRepository(models)
    cache = ModelCache(repository, budget_bytes=1 << 30,
                       options=BackendOptions(providers=("cpu",), cache_dir=root / name / "c"))
    cache.load(MODEL)
    link = MqttLink(MqttConfig(host="127.0.0.1", port=port), prefix=f"{prefix}/{name}",
                    client_id=f"bench-{prefix}-{name}")
    holder: list[OtaService] = []

    def report(event: Event) -> None:
        holder[0].report(event)

    updater = Updater(repository, cache, OtaConfig(keep_versions=2), TrustStore.load([key]),
                      report)
    ota = OtaService(updater, link, fleet_prefix=fleet, groups=[], chunk_timeout_s=60)
    holder.append(ota)
    return Agent(link, ota)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.fleet_agents")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--key", type=Path, required=True, help="trusted public key (PEM)")
    parser.add_argument("--model", type=Path, required=True, help="version 1 of the model")
    parser.add_argument("--prefix", default="sim")
    parser.add_argument("--fleet", default="sim/fleet")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    register_backend("onnxruntime", NullBackend)
    agents = [make_agent(args.root, f"dev-{i:05d}", args.port, args.prefix, args.fleet,
                         args.key, args.model)
              for i in range(args.first, args.first + args.count)]
    for agent in agents:
        agent.link.start()
        agent.ota.start()
    deadline = time.monotonic() + 120
    for agent in agents:
        if not agent.ota.wait_listening(max(0.1, deadline - time.monotonic())):
            print("failed: an agent's OTA subscriptions were not confirmed in 120 s",
                  flush=True)
            return 1
    print(f"ready {len(agents)}", flush=True)
    sys.stdin.read()  # until the bench closes it
    for agent in agents:
        agent.ota.stop(5)
    for agent in agents:
        agent.link.stop(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
