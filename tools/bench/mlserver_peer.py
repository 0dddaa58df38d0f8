"""Run Seldon MLServer as a peer server for edged benchmarks.

MLServer is the reference KServe V2 model server written in Python, so it is the natural
baseline for edged's V2 REST endpoint: both receive byte-identical V2 JSON requests and both
run the model with ONNX Runtime on the CPU.

`run_mlserver()` writes a throwaway MLServer configuration (``settings.json`` plus one
``model-settings.json``), starts ``mlserver start`` as a subprocess, waits until the model
reports ready and yields the server's base URL::

    with run_mlserver(Path("model.onnx"), "tiny_cls", workdir=tmp) as url:
        ...  # POST f"{url}/v2/models/tiny_cls/infer"

The model is served by ``OnnxRuntimeModel``, a plain custom MLServer runtime of the kind the
MLServer docs show: one ``onnxruntime.InferenceSession`` created in ``load()``, inputs decoded
and outputs encoded with MLServer's ``NumpyCodec`` in ``predict()``. The subprocess imports it
as ``mlserver_peer.OnnxRuntimeModel`` (this directory goes on its PYTHONPATH). The class is
built on first attribute access so that importing this module in the benchmark process never
imports MLServer itself (about 1 s of imports: FastAPI, gRPC, Prometheus, OpenTelemetry).
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

RUNTIME_IMPLEMENTATION = "mlserver_peer.OnnxRuntimeModel"
LOG_NAME = "mlserver.log"
REPOSITORY_DIR = "mlserver-repository"
STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
LOG_TAIL_CHARS = 4000
# MLServer reads any MLSERVER_* / MLSERVER_MODEL_* variable as a setting override; the peer
# must run with exactly the settings written here, so such variables are not passed on.
_ENV_PREFIX = "MLSERVER_"


def _build_runtime_class() -> type:
    """Define the MLServer runtime; runs only inside the MLServer subprocess."""
    import onnxruntime as ort
    from mlserver import MLModel
    from mlserver.codecs import NumpyCodec
    from mlserver.types import InferenceRequest, InferenceResponse
    from mlserver.utils import get_model_uri

    class OnnxRuntimeModel(MLModel):
        """ONNX Runtime (CPUExecutionProvider) behind MLServer's V2 data plane.

        ``parameters.uri`` names the .onnx file; ``parameters.extra.intra_op_num_threads``
        sets the session's intra-op thread count (default 1).
        """

        async def load(self) -> bool:
            extra: dict[str, Any] = {}
            if self.settings.parameters is not None and self.settings.parameters.extra:
                extra = self.settings.parameters.extra
            options = ort.SessionOptions()
            options.intra_op_num_threads = int(extra.get("intra_op_num_threads", 1))
            model_path = await get_model_uri(self.settings)
            self._session = ort.InferenceSession(
                model_path, sess_options=options, providers=["CPUExecutionProvider"]
            )
            self._output_names = [output.name for output in self._session.get_outputs()]
            return True

        async def predict(self, payload: InferenceRequest) -> InferenceResponse:
            feeds = {item.name: NumpyCodec.decode_input(item) for item in payload.inputs}
            results = self._session.run(self._output_names, feeds)
            return InferenceResponse(
                id=payload.id,
                model_name=self.name,
                model_version=self.version,
                outputs=[
                    NumpyCodec.encode_output(name, value)
                    for name, value in zip(self._output_names, results, strict=True)
                ],
            )

    # Defined in a function, but importable (and picklable) as mlserver_peer.OnnxRuntimeModel.
    OnnxRuntimeModel.__qualname__ = "OnnxRuntimeModel"
    return OnnxRuntimeModel


def __getattr__(name: str) -> Any:
    # PEP 562: MLServer resolves RUNTIME_IMPLEMENTATION with getattr(module, "OnnxRuntimeModel").
    if name == "OnnxRuntimeModel":
        runtime = _build_runtime_class()
        globals()[name] = runtime
        return runtime
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _mlserver_command() -> list[str]:
    # mlserver 1.7.1 has no __main__ module, so `python -m mlserver` does not work; use the
    # console script installed beside this interpreter (not resolved: a venv's python is a
    # symlink out of the venv).
    script = Path(sys.executable).parent / "mlserver"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "from mlserver.cli.main import main; main()"]


@functools.lru_cache(maxsize=1)
def mlserver_available() -> str | None:
    """None when MLServer can be started from this interpreter, else the reason it cannot."""
    # Checked in a child interpreter, which is where it will run, so that the benchmark
    # process does not import MLServer's dependency tree.
    probe = "import mlserver, mlserver.codecs, onnxruntime"
    try:
        done = subprocess.run(
            [sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot check for mlserver: {exc}"
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return f"mlserver is not importable: {lines[-1] if lines else done.returncode}"
    return None


def _write_settings(
    repository: Path, model_path: Path, model_name: str, intra_op_threads: int
) -> int:
    from tools.bench.broker import free_port  # in the bench process, never in MLServer's

    http_port = free_port()
    settings = {
        "host": "127.0.0.1",
        "http_port": http_port,
        # MLServer 1.7.1 always starts its gRPC server (there is no switch), so give it a free
        # port of its own; nothing connects to it.
        "grpc_port": free_port(),
        # None disables the Prometheus endpoint, its separate server and the per-request
        # PrometheusMiddleware.
        "metrics_endpoint": None,
        # 0 (any falsy value) skips the InferencePoolRegistry: the model is loaded and
        # predict() runs in the server's own process and event loop, with no worker
        # processes and no request/response pickling over a pipe. The default is 1 worker.
        "parallel_workers": 0,
        # debug defaults to True, which logs every request (uvicorn access log) at DEBUG.
        "debug": False,
        "load_models_at_startup": True,
    }
    model_settings = {
        "name": model_name,
        "implementation": RUNTIME_IMPLEMENTATION,
        "parameters": {
            "uri": str(model_path.resolve()),
            "extra": {"intra_op_num_threads": intra_op_threads},
        },
    }
    # MLServer loads every model-settings.json below its root: drop those of an earlier run.
    shutil.rmtree(repository, ignore_errors=True)
    # MLServer warns unless a model's settings sit in a folder named after the model.
    model_dir = repository / model_name
    model_dir.mkdir(parents=True, exist_ok=True)
    (repository / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")
    (model_dir / "model-settings.json").write_text(json.dumps(model_settings, indent=2) + "\n")
    return http_port


def _child_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(_ENV_PREFIX)}
    here = str(Path(__file__).resolve().parent)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = here if not path else os.pathsep.join([here, path])
    return env


def _log_tail(log_path: Path) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError as exc:
        return f"<no log: {exc}>"
    return text[-LOG_TAIL_CHARS:]


def _model_ready(port: int, model_name: str) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)
    try:
        conn.request("GET", f"/v2/models/{model_name}/ready")
        response = conn.getresponse()
        response.read()
        return response.status == 200
    except OSError:
        return False
    finally:
        conn.close()


def _wait_ready(proc: subprocess.Popen[bytes], port: int, model_name: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with status {proc.returncode} before the model was ready")
        if _model_ready(port, model_name):
            return
        time.sleep(0.2)
    raise RuntimeError(f"model {model_name!r} not ready within {timeout:.0f} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        logger.warning("mlserver (pid %d) ignored SIGTERM; killing it", proc.pid)
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def run_mlserver(
    model_path: Path,
    model_name: str,
    *,
    intra_op_threads: int = 1,
    workdir: Path,
    startup_timeout: float = STARTUP_TIMEOUT_S,
) -> Iterator[str]:
    """Serve `model_path` as `model_name` from an MLServer subprocess; yield its base URL.

    The configuration goes to ``workdir/mlserver-repository`` (``settings.json`` and
    ``<model_name>/model-settings.json``; rewritten on every call) and the server's combined
    stdout/stderr to ``workdir/mlserver.log``. Raises RuntimeError, with the tail of that log,
    if the model is not ready within `startup_timeout` seconds.
    """
    if not Path(model_path).is_file():
        raise FileNotFoundError(model_path)
    workdir.mkdir(parents=True, exist_ok=True)
    repository = workdir / REPOSITORY_DIR
    port = _write_settings(repository, Path(model_path), model_name, intra_op_threads)
    log_path = workdir / LOG_NAME
    command = [*_mlserver_command(), "start", str(repository)]
    logger.info("starting mlserver on port %d: %s", port, " ".join(command))
    started = time.monotonic()
    with open(log_path, "wb") as log:
        # cwd is the repository so that MLServer's cwd-relative paths (.env, .envs, .metrics)
        # land there; a new session keeps the terminal's Ctrl-C away from it, so shutdown is
        # always the SIGTERM below.
        proc = subprocess.Popen(
            command,
            cwd=repository,
            env=_child_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            try:
                _wait_ready(proc, port, model_name, startup_timeout)
            except RuntimeError as exc:
                raise RuntimeError(
                    f"mlserver failed to start: {exc}\n--- {log_path} (tail) ---\n"
                    f"{_log_tail(log_path)}"
                ) from None
            logger.info("mlserver ready in %.1f s (pid %d)", time.monotonic() - started, proc.pid)
            yield f"http://127.0.0.1:{port}"
        finally:
            _stop(proc)
            logger.info("mlserver stopped (status %s)", proc.returncode)
