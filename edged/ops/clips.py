"""`edged clips list|export`: a running daemon's event clips and continuous segments, over
its socket (or the loopback TCP listener). `list` prints them newest first (or as JSON);
`export` downloads one (by id, or the clip of an event) in HTTP ranges into a file, written
whole or not at all."""

from __future__ import annotations

import argparse
import http.client as httplib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from edged.core.errors import ToolError

CHUNK = 8 * 2**20  # bytes a range request asks for
TOTAL = re.compile(r"^bytes [0-9]+-[0-9]+/([0-9]+)$")


def add_clips_arguments(
        parser: argparse.ArgumentParser) -> tuple[argparse.ArgumentParser, ...]:
    """The `clips` subcommands; returns their parsers (each takes the target options)."""
    sub = parser.add_subparsers(dest="clips_command", required=True)
    listing = sub.add_parser("list", help="the clips a daemon keeps, newest first")
    listing.add_argument("--stream", help="only this stream's")
    listing.add_argument("--event", metavar="OBJECT_ID", help="only the clip of this event")
    listing.add_argument("--kind", choices=("clip", "segment"),
                         help="only event clips, or only continuous segments")
    listing.add_argument("--since", type=float, metavar="UNIX_S", help="ending after this")
    listing.add_argument("--until", type=float, metavar="UNIX_S", help="starting before this")
    listing.add_argument("--limit", type=int, default=100)
    listing.add_argument("--json", action="store_true", help="print the rows as JSON")
    export = sub.add_parser("export", help="download a clip into an MP4 file")
    which = export.add_mutually_exclusive_group(required=True)
    which.add_argument("id", nargs="?", help="the clip's id")
    which.add_argument("--event", metavar="OBJECT_ID", help="the clip of this event")
    which.add_argument("--stream", help="a span of this stream's continuous segments "
                                        "(with --since and --until), joined into one file")
    export.add_argument("--since", type=float, metavar="UNIX_S", help="the span's start")
    export.add_argument("--until", type=float, metavar="UNIX_S", help="the span's end")
    export.add_argument("--output", "-o", type=Path, required=True, metavar="FILE")
    return listing, export


def cmd_clips(args: argparse.Namespace, client: Any) -> int:
    with client:
        if args.clips_command == "list":
            rows = _list(client, stream=args.stream, event=args.event, kind=args.kind,
                         since=args.since, until=args.until, limit=args.limit)
            if args.json:
                print(json.dumps(rows, indent=2))
            else:
                print_rows(rows)
            return 0
        if args.stream is not None:
            return export_span(client, args)
        clip_id = args.id
        if clip_id is None:
            rows = _list(client, event=args.event, limit=1)
            if not rows:
                raise ToolError(f"no clip holds event {args.event!r}")
            clip_id = rows[0]["id"]
        size = export(client, clip_id, args.output)
        print(f"{args.output}: clip {clip_id}, {size} bytes")
        return 0


def _list(client: Any, **query: Any) -> list[dict[str, Any]]:
    params = urlencode({k: v for k, v in query.items() if v is not None})
    status, _headers, body = client.request("GET", f"/v2/edged/clips?{params}")
    if status != 200:
        raise ToolError(f"listing clips failed ({status}): {_message(body)}")
    return list(json.loads(body)["clips"])


def export(client: Any, clip_id: str, output: Path) -> int:
    """Download the clip in ranges into `output` (a temporary file renamed at the end)."""
    part = output.with_name(output.name + ".part")
    total: int | None = None
    done = 0
    try:
        with part.open("wb") as out:
            while total is None or done < total:
                status, headers, body = client.request(
                    "GET", f"/v2/edged/clips/{quote(clip_id, safe='')}",
                    headers={"Range": f"bytes={done}-{done + CHUNK - 1}"})
                if status == 416 and done == 0:  # an empty file
                    total = 0
                    break
                if status not in (200, 206):
                    raise ToolError(f"clip {clip_id}: {status}: {_message(body)}")
                out.write(body)
                done += len(body)
                if status == 200:
                    total = done
                    break
                match = TOTAL.match(headers.get("Content-Range", ""))
                if match is None or not body:
                    raise ToolError(f"clip {clip_id}: the daemon's range answer is malformed")
                total = int(match.group(1))
        os.replace(part, output)
    finally:
        part.unlink(missing_ok=True)
    return total or 0


def export_span(client: Any, args: argparse.Namespace) -> int:
    """The stream's segments overlapping [since, until], joined by the daemon (by remux, as
    it sends them: whole segments, so the file starts at the keyframe at or before `since`)
    and written into `FILE.part`, renamed when the whole span came."""
    if args.since is None or args.until is None or args.until <= args.since:
        raise ToolError("--stream needs --since and --until (Unix s), until after since")
    query = urlencode({"stream": args.stream, "since": args.since, "until": args.until})
    output: Path = args.output
    part = output.with_name(output.name + ".part")
    try:
        with part.open("wb") as out:
            try:
                status, headers, body = client.download(f"/v2/edged/span?{query}", out)
            except (httplib.IncompleteRead, OSError) as exc:
                raise ToolError(f"the span of {args.stream} was cut short: {exc}") from exc
        if status != 200:
            raise ToolError(f"span of {args.stream}: {status}: {_message(body)}")
        os.replace(part, output)
    finally:
        part.unlink(missing_ok=True)
    print(f"{output}: {headers.get('X-Edged-Segments', '?')} segments of {args.stream} "
          f"({headers.get('X-Edged-Span', '?')}), {output.stat().st_size} bytes")
    return 0


def print_rows(rows: list[dict[str, Any]]) -> None:
    table = [("CLIP", "STREAM", "START", "SECONDS", "SIZE", "EVENTS")]
    for row in rows:
        start = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["start_time"]))
        table.append((row["id"], row["stream"], start, f"{row['duration']:.1f}",
                      f"{row['size'] / 2**20:.1f} MiB", ", ".join(row["events"])))
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    for r in table:
        sys.stdout.write("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False))
                         + "  " + r[5] + "\n")


def _message(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", body[:200]))
    except (ValueError, AttributeError):
        return repr(body[:200])
