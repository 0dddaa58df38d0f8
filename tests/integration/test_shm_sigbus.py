"""A client of another uid shrinks its own shared memory object while its request waits for the
model (issue 20 #2): the daemon must survive, since such a client cannot kill it otherwise.

The daemon runs in a child process here: with views lent to that client (the old behaviour,
still there as `api.shm_copy_inputs: never`), the kernel kills it with SIGBUS, which would
take the test session with it. The check that it does die that way shows that the case below
really reaches the hazard."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

# Runs as root: a daemon on a gated model, and a client that becomes nobody.
VICTIM = """
import json, subprocess, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from support.backends import GateBackend
from support.daemon import serve
from edged.backends import register_backend
from edged.config import parse_config

repo, sock, copy_inputs = sys.argv[2], sys.argv[3], sys.argv[4]
gate = GateBackend()
register_backend("onnxruntime", lambda: gate)
config = parse_config(f'''device_id: t
models_dir: {repo}
cache: {{dir: {Path(sock).parent / 'cache'}, preload: [tiny_cls]}}
backends: {{onnxruntime: {{providers: [cpu], intra_op_threads: 1}}}}
api: {{socket: {sock}, socket_mode: "0666", shm_copy_inputs: {copy_inputs}}}
mqtt: {{enabled: false}}
''')
running = serve(config)
next(running)
gate.reset()  # forget the warm-up; hold what comes next
gate.gate.clear()
client = subprocess.Popen([sys.executable, "-c", sys.argv[5], sock], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
gate.wait_calls(1, timeout=30)  # its request is at the model, its bytes not yet read by it
client.stdin.write("shrink\\n"); client.stdin.flush()
assert client.stdout.readline().strip() == "shrunk"
gate.gate.set()
out, _ = client.communicate(timeout=60)
print(out.strip(), flush=True)
next(running, None)
"""

# Both clients: a request on the region in flight (held at the model by the victim's gate),
# the object shrunk when the victim says so, then what the request got.
SHRINK = """
import json, sys, threading
from edged.ops.client import ApiError
seen = {}

def shrink_under_the_request(client, tensor, shrink):
    def call():
        try:
            seen["shape"] = list(client.infer("tiny_cls", {"x": tensor}).outputs["prob"].shape)
        except ApiError as exc:
            seen["error"] = f"{exc.status} {exc}"
        except OSError as exc:
            seen["error"] = f"connection: {exc}"
    caller = threading.Thread(target=call)
    caller.start()
    sys.stdin.readline()
    shrink()
    print("shrunk", flush=True)
    caller.join(60)
"""

# The client: nobody, with its own shm object (owned by nobody, mode 0600).
CLIENT = SHRINK + """
import os
import numpy as np
from edged.ops.client import EdgedClient, SharedRegion
os.setgid(65534); os.setgroups([]); os.setuid(65534)
x = np.ones((1, 3, 8, 8), np.float32)
with EdgedClient(sys.argv[1], timeout_s=60) as client, \\
        SharedRegion(f"edged-bus-{os.getpid()}", 4096, mode=0o600) as region:
    client.register_shm("frames", region.key, 4096)
    tensor = region.tensor("frames", x)
    shrink_under_the_request(client, tensor, lambda: os.truncate(region.path, 0))
    print(json.dumps(seen), flush=True)
"""


# The client: edged's own uid (root), with an object that nobody made first (a squatted name,
# mode 0666): nobody truncates it, and the daemon's trust in its peer must not reach it.
SQUATTED = SHRINK + """
import mmap, os
import numpy as np
from edged.ops.client import EdgedClient
from edged.api.protocol import ShmRef, ShmTensor

def as_nobody(action):
    pid = os.fork()
    if pid == 0:
        os.setgid(65534); os.setgroups([]); os.setuid(65534)
        action()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0

key = f"edged-squat-{os.getpid()}"
path = "/dev/shm/" + key
def squat():
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
    os.fchmod(fd, 0o666); os.ftruncate(fd, 4096); os.close(fd)
as_nobody(squat)
x = np.ones((1, 3, 8, 8), np.float32)
try:
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 4096) as m:
        m[:x.nbytes] = x.tobytes()
    with EdgedClient(sys.argv[1], timeout_s=60) as client:
        client.register_shm("frames", key, 4096)
        tensor = ShmTensor(ShmRef("frames", 0, x.nbytes), "FP32", x.shape)
        shrink_under_the_request(client, tensor, lambda: as_nobody(lambda: os.truncate(path, 0)))
finally:
    os.unlink(path)
print(json.dumps(seen), flush=True)
"""


def victim(repo_dir: Path, short_dir: Path, copy_inputs: str,
           client: str = CLIENT) -> subprocess.CompletedProcess[str]:
    os.chmod(short_dir, 0o755)  # nobody must reach the socket's folder
    return subprocess.run(
        [sys.executable, "-c", VICTIM, str(TESTS), str(repo_dir), str(short_dir / "v.sock"),
         copy_inputs, client], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
def test_shm_when_a_stranger_shrinks_its_object_under_a_queued_request_edged_survives(
        repo_dir: Path, short_dir: Path) -> None:
    done = victim(repo_dir, short_dir, "auto")
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"shape": [1, 4]}  # its bytes were copied in as the request was read


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
def test_shm_when_views_are_lent_to_a_stranger_its_shrink_kills_edged(
        repo_dir: Path, short_dir: Path) -> None:
    done = victim(repo_dir, short_dir, "never")
    assert done.returncode == -signal.SIGBUS, (done.returncode, done.stderr[-2000:])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
def test_shm_when_edgeds_own_uid_registers_an_object_another_user_owns_edged_survives_its_shrink(
        repo_dir: Path, short_dir: Path) -> None:
    """Views are lent for the peer's sake only when nobody else can shrink the object: one that
    another uid owns (or anyone may write) is copied in, whoever registers it."""
    done = victim(repo_dir, short_dir, "auto", SQUATTED)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"shape": [1, 4]}


# Issue 41 #5: a trusted peer (edged's own uid, root here) is lent views of its own object,
# and truncates it while its request waits in the queue. The request is batched with another
# (a copy into the pooled batch buffer, made anyway): read from the file, the shrink is a 400
# for that request, and the daemon and the rest of the batch live. Before, the copy went
# through the mapping: SIGBUS.
BATCHED_VICTIM = """
import json, subprocess, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, sys.argv[1])
from support.backends import GateBackend, hold_worker
from support.daemon import serve
from support.polling import wait_until
from edged.backends import register_backend
from edged.config import parse_config
from edged.inference import instances

repo, sock = sys.argv[2], sys.argv[3]
instances.cores = lambda: 1  # one worker, held below: the client's requests queue behind it
gate = GateBackend()
register_backend("onnxruntime", lambda: gate)
config = parse_config(f'''device_id: t
models_dir: {repo}
cache: {{dir: {Path(sock).parent / 'cache'}, preload: [tiny_cls]}}
backends: {{onnxruntime: {{providers: [cpu], intra_op_threads: 1}}}}
api: {{socket: {sock}, shm_copy_inputs: auto}}
mqtt: {{enabled: false}}
''')
running = serve(config)
daemon = next(running)
# The worker held inside the model by a request of the daemon's own (one alone on the API
# would run on the event loop, and hold that).
held = hold_worker(daemon.scheduler, gate, "tiny_cls", {"x": np.ones((1, 3, 8, 8), np.float32)})
client = subprocess.Popen([sys.executable, "-c", sys.argv[4], sock], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True)
batcher = daemon.scheduler.batchers()[0]
wait_until(lambda: batcher.depth == 2, timeout=30, what="two requests queued")
client.stdin.write("shrink\\n"); client.stdin.flush()
assert client.stdout.readline().strip() == "shrunk"
gate.gate.set()
assert held.result(30)["prob"].shape == (1, 4)
out, _ = client.communicate(timeout=60)
print(out.strip(), flush=True)
next(running, None)
"""

TRUSTED_CLIENT = """
import json, os, sys, threading
import numpy as np
from edged.ops.client import ApiError, EdgedClient, SharedRegion
seen = {}

def call(name, inputs):
    try:
        with EdgedClient(sys.argv[1], timeout_s=60) as client:
            seen[name] = list(client.infer("tiny_cls", inputs).outputs["prob"].shape)
    except ApiError as exc:
        seen[name] = f"{exc.status} {exc}"

x = np.ones((1, 3, 8, 8), np.float32)
with EdgedClient(sys.argv[1], timeout_s=60) as client, \\
        SharedRegion(f"edged-own-{os.getpid()}", 4096, mode=0o600) as region:
    client.register_shm("frames", region.key, 4096)
    tensor = region.tensor("frames", x)
    queued = [threading.Thread(target=call, args=("shm", {"x": tensor})),
              threading.Thread(target=call, args=("beside", {"x": x}))]
    for thread in queued:
        thread.start()
    sys.stdin.readline()  # "shrink": both wait in the queue, behind the held worker
    os.truncate(region.path, 0)
    print("shrunk", flush=True)
    for thread in queued:
        thread.join(60)
print(json.dumps(seen), flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="runs as root: the peer edged trusts with views")
def test_shm_when_a_trusted_peer_shrinks_its_object_under_a_batched_request_edged_survives(
        repo_dir: Path, short_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BATCHED_VICTIM, str(TESTS), str(repo_dir),
         str(short_dir / "v.sock"), TRUSTED_CLIENT], capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["beside"] == [1, 4]  # the rest of its batch ran
    assert seen["shm"].startswith("400 ") and "has shrunk" in seen["shm"], seen
