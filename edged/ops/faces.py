"""`edged faces ...`: a running daemon's face gallery over its socket (or the loopback TCP
listener): `list`, `show NAME`, `add NAME IMAGE|--snapshot ID`, `not NAME IMAGE|--snapshot ID`
(a negative: this face is not NAME), `delete NAME`, `delete-entry ID`, `groups`, `group G`
(its sightings), `crop --entry ID | --sighting ID -o FILE` (the aligned face, PNG),
`name-group GROUP NAME`, `delete-group GROUP`, `reembed`. Errors print their code and
message (no_face, several_faces, gallery_full, image_invalid, ...) and exit 1."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

PREFIX = "/v2/edged/galleries/faces"


def add_faces_arguments(parser: argparse.ArgumentParser) -> tuple[argparse.ArgumentParser, ...]:
    """The `faces` subcommands; returns their parsers (each takes the target options)."""
    sub = parser.add_subparsers(dest="faces_command", required=True)
    parsers = [sub.add_parser("list", help="enrolled names, unknown groups, the bounds"),
               sub.add_parser("groups", help="unknown faces grouped by look-alikes"),
               sub.add_parser("reembed", help="re-embed the gallery with the serving embedder")]
    show = sub.add_parser("show", help="a name's entries")
    show.add_argument("name")
    parsers.append(show)
    for verb, what in (("add", "enrol the one face of an image under NAME"),
                       ("not", "a negative: the face of the image is not NAME")):
        enrol = sub.add_parser(verb, help=what)
        enrol.add_argument("name")
        which = enrol.add_mutually_exclusive_group(required=True)
        which.add_argument("image", nargs="?", type=Path, help="JPEG/PNG file")
        which.add_argument("--snapshot", metavar="OBJECT_ID", help="an event's snapshot")
        parsers.append(enrol)
    group = sub.add_parser("group", help="an unknown group's kept sightings")
    group.add_argument("group", type=int)
    crop = sub.add_parser("crop", help="save the aligned face an entry or sighting came from")
    which_crop = crop.add_mutually_exclusive_group(required=True)
    which_crop.add_argument("--entry", type=int, metavar="ID")
    which_crop.add_argument("--sighting", type=int, metavar="ID")
    crop.add_argument("--output", "-o", type=Path, required=True, metavar="FILE")
    parsers += [group, crop]
    delete = sub.add_parser("delete", help="forget a name (its entries and negatives)")
    delete.add_argument("name")
    entry = sub.add_parser("delete-entry", help="forget one entry")
    entry.add_argument("id", type=int)
    name_group = sub.add_parser("name-group", help="enrol an unknown group under a name")
    name_group.add_argument("group", type=int)
    name_group.add_argument("name")
    delete_group = sub.add_parser("delete-group", help="forget an unknown group")
    delete_group.add_argument("group", type=int)
    parsers += [delete, entry, name_group, delete_group]
    for p in parsers:
        p.add_argument("--json", action="store_true", help="print the answer as JSON")
    return tuple(parsers)


def cmd_faces(args: argparse.Namespace, client: Any) -> int:
    if args.faces_command == "crop":
        return _crop(args, client)
    with client:
        status, answer = _call(client, args)
    if status >= 300:
        print(f"edged faces {args.faces_command}: {answer.get('code', status)}: "
              f"{answer.get('error', answer)}", file=sys.stderr)
        return 1
    if args.json or args.faces_command not in ("list", "groups"):
        print(json.dumps(answer, indent=2))
    elif args.faces_command == "list":
        counts = answer["counts"]
        print(f"{counts['entries']} of {counts['max_entries']} faces enrolled, "
              f"{counts['unknowns']} of {counts['max_unknowns']} unknown sightings kept; "
              f"embedder {answer['embedder']['embedder']}")
        for row in answer["names"]:
            print(f"  {row['name']}: {row['entries']} faces, {row['negatives']} negatives")
        for row in answer["groups"]:
            print(f"  unknown group {row['group']}: {row['sightings']} sightings")
    else:
        for row in answer["groups"]:
            print(f"group {row['group']}: {row['sightings']} sightings")
    return 0


def _call(client: Any, args: argparse.Namespace) -> tuple[int, Any]:
    command = args.faces_command
    if command == "list":
        return _json(client, "GET", PREFIX)
    if command == "groups":
        return _json(client, "GET", f"{PREFIX}/groups")
    if command == "reembed":
        return _json(client, "POST", f"{PREFIX}/reembed", b"{}")
    if command == "group":
        return _json(client, "GET", f"{PREFIX}/groups/{args.group}")
    if command == "show":
        return _json(client, "GET", f"{PREFIX}/names/{quote(args.name, safe='')}")
    if command in ("add", "not"):
        path = f"{PREFIX}/names/{quote(args.name, safe='')}" + \
            ("/negatives" if command == "not" else "")
        if args.snapshot is not None:
            return _json(client, "POST", path, json.dumps({"snapshot": args.snapshot}).encode())
        return _json(client, "POST", path, args.image.read_bytes(),
                     "application/octet-stream")
    if command == "delete":
        return _json(client, "DELETE", f"{PREFIX}/names/{quote(args.name, safe='')}")
    if command == "delete-entry":
        return _json(client, "DELETE", f"{PREFIX}/entries/{args.id}")
    if command == "name-group":
        return _json(client, "POST", f"{PREFIX}/groups/{args.group}/name",
                     json.dumps({"name": args.name}).encode())
    return _json(client, "DELETE", f"{PREFIX}/groups/{args.group}")


def _crop(args: argparse.Namespace, client: Any) -> int:
    path = f"{PREFIX}/entries/{args.entry}/crop" if args.entry is not None else \
        f"{PREFIX}/sightings/{args.sighting}/crop"
    with client:
        status, _headers, raw = client.request("GET", path)
    if status != 200:
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = {"error": raw[:200].decode(errors="replace")}
        print(f"edged faces crop: {answer.get('code', status)}: {answer.get('error')}",
              file=sys.stderr)
        return 1
    args.output.write_bytes(raw)
    print(f"{args.output}: {len(raw)} bytes")
    return 0


def _json(client: Any, method: str, path: str, body: bytes | None = None,
          content_type: str = "application/json") -> tuple[int, Any]:
    status, _headers, raw = client.request(method, path, body,
                                           {"Content-Type": content_type} if body else None)
    try:
        return status, json.loads(raw) if raw else {}
    except ValueError:
        return status, {"error": raw[:200].decode(errors="replace")}
