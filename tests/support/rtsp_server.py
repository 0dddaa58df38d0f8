"""A real RTSP server for tests: Debian's GStreamer RTSP server (gst-rtsp-server through
python3-gi, which lives in the system Python: tests run this file as a subprocess under
/usr/bin/python3). It serves one MP4 file's H.264 or H.265 track, unchanged (no re-encode),
on rtsp://127.0.0.1:<port>/<mount>; every client gets the file from its start, played at its
own rate. It prints `ready` once it listens and stops by itself after `--lifetime-s`.

    /usr/bin/python3 tests/support/rtsp_server.py --port 8554 --mount cam video.mp4
"""

from __future__ import annotations

import argparse
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402


def launch_line(path: str, codec: str) -> str:
    parse, pay = ("h265parse", "rtph265pay") if codec == "h265" else ("h264parse", "rtph264pay")
    return (f"( filesrc location={path} ! qtdemux ! {parse} config-interval=-1 ! "
            f"{pay} name=pay0 pt=96 config-interval=-1 )")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("file")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mount", default="cam")
    parser.add_argument("--codec", choices=("h264", "h265"), default="h264")
    parser.add_argument("--lifetime-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(launch_line(args.file, args.codec))
    factory.set_shared(False)  # every client from the start of the file
    server.get_mount_points().add_factory(f"/{args.mount}", factory)
    loop = GLib.MainLoop()
    if server.attach(None) == 0:
        print(f"cannot listen on 127.0.0.1:{args.port}", flush=True)
        return 1
    GLib.timeout_add(int(args.lifetime_s * 1000), loop.quit)
    print("ready", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
