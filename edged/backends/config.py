"""The backends' section of the daemon config (`backends:`): the ONNX Runtime provider chain
and options, TensorRT engine options, and where batches are assembled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from edged.core.schema import at_least, between, setting


@dataclass(frozen=True)
class OrtConfig:
    providers: list[Literal["tensorrt", "cuda", "cpu"]] = setting(
        factory=lambda: ["tensorrt", "cuda", "cpu"], help="provider chain, best first")
    intra_op_threads: int = setting(
        0, "threads inside one operator; 0 = per model on the CPU, 1 or one per core, "
        "whichever runs it faster (timed once, remembered; edged.inference.threads)",
        check=at_least(0))
    inter_op_threads: int = setting(1, "threads across operators", check=at_least(0))
    allow_spinning: bool = setting(False, "idle ORT threads spin (fast alone, bad when shared)")
    graph_optimization: Literal["disable", "basic", "extended", "all"] = setting(
        "all", "ONNX Runtime graph optimisation level")


@dataclass(frozen=True)
class TensorRTConfig:
    workspace_mb: int = setting(1024, "builder workspace in MiB (also ORT's TensorRT EP)",
                                check=at_least(16))
    dla_core: int | None = setting(None, "Jetson: build engines for this DLA core (layers it "
                                   "cannot run fall back to the GPU); null = the GPU",
                                   check=between(0, 15))


@dataclass(frozen=True)
class BackendsConfig:
    default: Literal["auto", "tensorrt", "onnxruntime"] = setting(
        "auto", "backend for models whose model.yaml says auto")
    onnxruntime: OrtConfig = setting(factory=OrtConfig, help="ONNX Runtime options")
    tensorrt: TensorRTConfig = setting(factory=TensorRTConfig, help="TensorRT engine options")
    memory: Literal["auto", "mapped", "managed", "pinned", "host"] = setting(
        "auto", "where batches are assembled: auto = mapped (zero-copy) on integrated GPUs, "
        "pinned + async copies on discrete ones, host without CUDA; managed = unified memory")
