"""The operator's commands of the `edged` CLI: call a running daemon (`infer`, `models`,
`status`), sign and push model updates (`ota`), and make INT8 variants (`quantize`). They run on
an operator's machine as well as on the device; the daemon never imports them."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edged.api.config import default_socket
from edged.api.protocol import TRITON_TO_NUMPY
from edged.config import DEFAULT_CONFIG_PATH, load_config
from edged.core.errors import InvalidInput
from edged.model.config import PostprocessConfig, PreprocessConfig
from edged.model.heads import Head
from edged.model.tensor import TensorSpec
from edged.ops.clips import add_clips_arguments, cmd_clips
from edged.ops.faces import add_faces_arguments, cmd_faces
from edged.ops.mender import add_arguments as add_mender_arguments
from edged.ops.quantize.command import add_arguments as add_quantize_arguments
from edged.processing.post import Postprocessor, published
from edged.processing.pre import Geometry, is_size_input, size_inputs
from edged.tasks import BOXED_TASKS

if TYPE_CHECKING:
    from edged.ops.client import EdgedClient

Command = Callable[[argparse.Namespace], int]

ROLLOUT_HELP = """rollouts:
  A manifest's "rollout" says how the new version earns its place on each device:
    {"mode": "direct"}   (the default) serve it once warmed and golden-checked
    {"mode": "shadow", "sample": 0.1, "min_samples": 500, "max_duration_s": 3600,
     "promote_if": {"min_top1_agreement": 0.98, "max_failure_rate": 0}}
                         install it beside the serving version, run that share of live
                         inputs through it too (lowest priority, skipped when busy),
                         promote it after min_samples if every bound holds, else
                         reject it; progress retained on <prefix>/ota/<model>/shadow
  Bounds: min_top1_agreement (classifiers), min_box_f1, min_label_agreement
  (detectors, IoU >= 0.5), min_cosine, min_cosine_sample, max_mean_abs_error,
  max_abs_error, max_relative_error, max_failure_rate, max_p99_ms.
  Decide early with a signed command on <prefix>/ota/<model>/command:
  {"model", "action": "promote" | "reject", "version"}: edged ota decide.
  --waves 1,10%,100% sends wave by wave and halts on the first unhealthy wave.
"""


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> dict[str, Command]:
    """Add the operator's subcommands to the `edged` parser; returns their handlers by name."""
    infer = sub.add_parser("infer", help="run one inference on a running daemon")
    infer.add_argument("model")
    infer.add_argument("--input", "-i", action="append", required=True, metavar="[NAME=]FILE",
                       help=".npy array or image (jpg/png/...: preprocessed as the model "
                            "says); NAME= for models with several inputs")
    infer.add_argument("--version", type=int, help="model version (default: the active one)")
    infer.add_argument("--json", action="store_true", help="print the response as JSON")
    infer.add_argument("--raw", action="store_true",
                       help="print the output tensors, not what the model's postprocess makes "
                            "of them (labels, boxes)")
    infer.add_argument("--output", "-o", type=Path, metavar="IMAGE",
                       help="write the input image with the detections drawn on it")
    _add_target(infer)
    models = sub.add_parser("models", help="list a running daemon's models")
    _add_target(models)
    status = sub.add_parser("status", help="a running daemon's health, models, streams, broker")
    status.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_target(status)
    ota = sub.add_parser("ota", help="OTA keys and manifests")
    ota_sub = ota.add_subparsers(dest="ota_command", required=True)
    keygen = ota_sub.add_parser("keygen", help="make an Ed25519 key pair (KEY and KEY.pub)")
    keygen.add_argument("key", type=Path)
    sign = ota_sub.add_parser("sign", help="sign a manifest (prints the signed JSON)")
    sign.add_argument("manifest", type=Path)
    sign.add_argument("--key", type=Path, required=True, help="Ed25519 private key (PEM)")
    sign.add_argument("--artifact", type=Path, help="fill in artifact.size and sha256 from it")
    sign.add_argument("--out", "-o", type=Path, help="write here instead of stdout")
    sign.add_argument("--target", metavar="PREFIX",
                      help="the topic root it is for: a device prefix, the fleet prefix or "
                           "<fleet>/groups/<group> (devices refuse it elsewhere)")
    sign.add_argument("--seq", type=int, help="its sequence number (default: the time in ms)")
    _add_ttl(sign)
    push = ota_sub.add_parser(
        "push", help="publish a manifest and follow the devices' status",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Publish a manifest and follow the devices' status to the end (exit 0: all "
        "active, 1: a device failed or a wave halted, 2: a device did not answer in time).",
        epilog=ROLLOUT_HELP)
    push.add_argument("manifest", type=Path)
    push.add_argument("--key", type=Path, help="sign it (filling in the artifact) before sending")
    push.add_argument("--artifact", type=Path, help="the artifact file (size, sha256, sending)")
    push.add_argument("--serve", metavar="HOST:PORT",
                      help="serve --artifact over HTTP from here while the devices fetch it")
    push.add_argument("--url-host", help="the host name devices reach --serve by")
    push.add_argument("--inline", action="store_true",
                      help="send --artifact as MQTT chunks of 64 KiB (small models)")
    push.add_argument("--retain", action="store_true",
                      help="retain the manifest: devices offline now get it when they connect")
    push.add_argument("--waves", metavar="N|N%,...",
                      help="canary waves, e.g. 1,10%%,100%%: cumulative device counts or shares "
                           "of the fleet (the devices named, or those whose retained status "
                           "says online); each wave must be healthy (active; for a shadow "
                           "rollout, promoted) before the next is sent. Needs --key")
    push.add_argument("--rollback-on-halt", action="store_true",
                      help="with --waves: when a wave halts, reject its candidates still in "
                           "their shadow run and roll back its devices that took the version")
    _add_ota_target(push, timeout=600.0)
    _add_ttl(push)
    roll = ota_sub.add_parser("rollback", help="ask devices to serve the previous version")
    roll.add_argument("model")
    roll.add_argument("--key", type=Path, help="sign the command (devices require it unless "
                                               "ota.allow_unsigned)")
    roll.add_argument("--from-version", type=int,
                      help="only devices serving this version roll back (fleet-wide use)")
    _add_ota_target(roll, timeout=120.0)
    _add_ttl(roll)
    decide = ota_sub.add_parser("decide", help="promote or reject the candidate of a shadow "
                                              "rollout now (a signed command)")
    decide.add_argument("model")
    choice = decide.add_mutually_exclusive_group(required=True)
    choice.add_argument("--promote", action="store_true", help="serve the candidate now")
    choice.add_argument("--reject", action="store_true", help="drop the candidate")
    decide.add_argument("--version", type=int, help="only if the candidate is this version")
    decide.add_argument("--key", type=Path, help="sign the command (devices require it unless "
                                                 "ota.allow_unsigned)")
    _add_ota_target(decide, timeout=120.0)
    _add_ttl(decide)
    mender = ota_sub.add_parser(
        "mender-artifact", help="make a Mender artifact (type edged-model) of a model version",
        description="One model version as a Mender artifact for the edged-model update module "
        "(deploy/mender/edged-model): a manifest signed with the fleet key, the model attached, "
        "written and signed for Mender by mender-artifact.")
    add_mender_arguments(mender)
    clips = sub.add_parser("clips", help="a running daemon's event clips: list, export")
    for parser in add_clips_arguments(clips):
        _add_target(parser)
    faces = sub.add_parser("faces", help="a running daemon's face gallery: enrol, negatives, "
                                         "groups, delete")
    for parser in add_faces_arguments(faces):
        _add_target(parser)
    quantize = sub.add_parser("quantize", help="make a model's INT8 variant and gate it on "
                              "accuracy (exit 0 accepted, 1 refused, 2 usage, 3 failed)")
    add_quantize_arguments(quantize)
    return {"infer": cmd_infer, "models": cmd_models, "status": cmd_status, "ota": cmd_ota,
            "quantize": cmd_quantize, "clips": lambda args: cmd_clips(args, _client(args)),
            "faces": lambda args: cmd_faces(args, _client(args))}


def _add_ttl(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ttl", type=float, default=86400.0, metavar="SECONDS",
                        help="devices refuse the signed message after this long (default: a "
                             "day; at most 31 days)")


def _add_ota_target(parser: argparse.ArgumentParser, timeout: float) -> None:
    parser.add_argument("--broker", default="127.0.0.1:1883", metavar="HOST:PORT")
    parser.add_argument("--username")
    parser.add_argument("--password-file", type=Path)
    parser.add_argument("--ca-file", type=Path, help="connect with TLS, trusting this CA")
    parser.add_argument("--device", action="append", default=[], metavar="PREFIX",
                        help="a device's topic prefix, e.g. edged/edge-01 (repeatable)")
    parser.add_argument("--fleet", metavar="PREFIX", help="the fleet prefix, e.g. edged/fleet")
    parser.add_argument("--group", help="with --fleet: only this group")
    parser.add_argument("--watch", action="append", default=[], metavar="PREFIX",
                        help="device prefixes to follow (MQTT wildcards; default: the devices, "
                             "or the fleet prefix's siblings)")
    parser.add_argument("--expect", type=int, help="devices that must answer")
    parser.add_argument("--timeout", type=float, default=timeout, help="seconds to follow")


def _add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", type=Path, help="daemon socket (default: from --config)")
    parser.add_argument("--http", metavar="HOST:PORT", help="use the loopback TCP listener")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG_PATH,
                        help="read api.socket from this file when --socket is not given")


def _client(args: argparse.Namespace) -> EdgedClient:
    from edged.ops.client import EdgedClient

    if args.http:
        return EdgedClient(http=args.http)
    socket = args.socket
    if socket is None:
        socket = load_config(args.config).api.socket if args.config.exists() else \
            default_socket()
    return EdgedClient(socket)


def cmd_models(args: argparse.Namespace) -> int:
    with _client(args) as client:
        rows = client.models()
    table = [("MODEL", "VERSION", "STATE", "BACKEND", "PROVIDERS / REASON")]
    for row in rows:
        detail = ", ".join(row.get("providers", [])) or row.get("reason", "")
        table.append((row["name"], row["version"], row["state"], row.get("backend", "-"),
                      detail))
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[4])
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """One screen: health, models, queues, streams, broker, recent warnings. Exit 0 when the
    daemon is live and ready, 1 otherwise."""
    from edged.ops.status import render

    with _client(args) as client:
        report = client.status()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
    return 0 if report.get("live") and report.get("ready") else 1


def cmd_infer(args: argparse.Namespace) -> int:
    """Print what the model means (top-k labels, boxes with their masks or keypoints) when its
    postprocess says, else (or with --raw) the tensors. `--json`: the tensors, and the results
    as a stream publishes them (`results`) unless --raw."""
    with _client(args) as client:
        meta = client.model_config(args.model, args.version)
        inputs, images = read_inputs(meta, args.model, args.input)
        result = client.infer(args.model, inputs, version=args.version)
    image = next(iter(images.values()), None)
    post = meta["edged"].get("postprocess") or {}
    meant = not args.raw and post.get("kind") in MEANT
    if args.json:
        answer: dict[str, Any] = {"model_name": result.model, "model_version": result.version,
                                  "outputs": {k: v.tolist() for k, v in result.outputs.items()}}
        if meant:
            answer["results"] = _results(meta, result.outputs, image)
        print(json.dumps(answer))
        return 0
    print(f"{result.model}:{result.version}")
    if not meant:
        if args.output is not None:
            raise InvalidInput("--output draws detections: the model is not a detector, or "
                               "--raw was given")
        with np.printoptions(precision=5, suppress=True, threshold=64, edgeitems=4):
            for name, array in result.outputs.items():
                print(f"{name} {array.dtype} {list(array.shape)}\n{array}")
        return 0
    results = _results(meta, result.outputs, image)
    for line in describe_results(results, framed=image is not None):
        print(line)
    if args.output is not None:
        if image is None or not {"detections", "segments"} & set(results):
            raise InvalidInput("--output draws detections on the input image: give an image "
                               "to a detect model")
        write_drawing(args.output, image[0], results.get("detections", []),
                      results.get("segments", []))
        print(f"drawn: {args.output}")
    return 0


# The tasks `edged infer` reads the outputs of (else it prints the tensors).
MEANT = ("classify", "text", "semantic", *BOXED_TASKS)


def _results(meta: dict[str, Any], outputs: dict[str, np.ndarray],
             image: tuple[np.ndarray, Geometry] | None) -> dict[str, Any]:
    """The outputs post-processed as the model's config says, in their published form."""
    head = meta["edged"].get("head")
    postprocessor = Postprocessor(PostprocessConfig(**meta["edged"]["postprocess"]), Path("."),
                                  Head(**head) if head else None)
    return published(postprocessor(outputs, image[1] if image is not None else None))


def describe_results(results: dict[str, Any], *, framed: bool) -> list[str]:
    """A person's reading of post-processed results: one line a class or a detection."""
    if "classes" in results:
        return [f"  {c['label']:<20} {c['score']:.4f}" for c in results["classes"]]
    if "text" in results:
        return [f"  {results['text']['text']!r} {results['text']['score']:.4f}"]
    if "segments" in results:
        return [f"  {s['label']:<20} {s['area']:.4f} of the picture, "
                f"{len(s['polygons'])} region(s)" for s in results["segments"]]
    detections = results["detections"]
    where = "image pixels" if framed else "input-tensor pixels"
    lines = [f"  {len(detections)} detection(s), boxes x1,y1,x2,y2 in {where}"]
    for d in detections:
        box = ", ".join(f"{v:.0f}" for v in d["box"])
        more = ""
        if "mask" in d:
            more += f"  mask of {len(d['mask'])} points"
        if "text" in d:
            more += f"  text {d['text']!r} {d['text_score']:.3f}"
        if "keypoints" in d:
            sure = sum(1 for p in d["keypoints"].values() if len(p) < 3 or p[2] >= 0.5)
            more += f"  {sure}/{len(d['keypoints'])} keypoints"
        lines.append(f"  {d['label']:<20} {d['score']:.3f}  [{box}]{more}")
    return lines


def write_drawing(path: Path, frame: np.ndarray, detections: list[dict[str, Any]],
                  regions: list[dict[str, Any]] | None = None) -> None:
    import cv2

    from edged.processing.draw import Overlay, annotate

    drawn = annotate(frame, Overlay(
        masks=[(d["label"], d["mask"]) for d in detections if d.get("mask")]
        + [(s["label"], p) for s in regions or () for p in s["polygons"]],
        poses=[(d["label"], d["keypoints"]) for d in detections if d.get("keypoints")]))
    for d in detections:
        x1, y1, x2, y2 = (round(v) for v in d["box"])
        cv2.rectangle(drawn, (x1, y1), (x2, y2), (0, 255, 0), 2)
        cv2.putText(drawn, f"{d['label']} {d['score']:.2f}", (x1, max(y1 - 4, 12)),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 255, 0), 1, cv2.LINE_AA)
    if not cv2.imwrite(str(path), drawn):
        raise InvalidInput(f"--output {path}: OpenCV cannot write that (its suffix names "
                           "the format: .jpg, .png)")


IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}


def read_inputs(meta: dict[str, Any], model: str, given: list[str]
                ) -> tuple[dict[str, np.ndarray], dict[str, tuple[np.ndarray, Geometry]]]:
    """`--input` values as tensors: .npy as they are (one sample of a batched model given a
    batch dim, as an image is), images preprocessed as the model's `preprocess` says (its
    defaults when it says nothing). Also each image and where it landed in its tensor, by
    input name, so results can be drawn on it."""
    batched = meta["max_batch_size"] > 0
    specs = {t["name"]: TensorSpec(t["name"], np.dtype(TRITON_TO_NUMPY[t["data_type"][5:]]),
                                   tuple(([1] if batched else []) + t["dims"]))
             for t in meta["input"]}
    inputs, images = {}, {}
    for item in given:
        name, sep, file = item.partition("=")
        if not sep:
            # D-FINE's orig_target_sizes is filled from the image: one image input is named.
            images_in = [n for n, sp in specs.items() if not is_size_input(sp, batched)]
            if len(images_in) != 1:
                raise InvalidInput(f"{model} has inputs {', '.join(specs)}: use NAME=FILE")
            name, file = images_in[0], item
        if name not in specs:
            raise InvalidInput(f"{model} has no input {name!r} (inputs: {', '.join(specs)})")
        path = Path(file)
        if not path.is_file():
            raise InvalidInput(f"--input {file}: no such file")
        if path.suffix.lower() in IMAGE_SUFFIXES:
            label = f"{model}:{meta['edged'].get('version', '?')}"
            frame, inputs[name], geometry = _image_tensor(
                path, label, meta["edged"].get("preprocess"), specs[name], batched)
            images[name] = (frame, geometry)
        else:
            inputs[name] = _batched(path, np.load(path, allow_pickle=False), specs[name],
                                    batched)
    first = next(iter(specs))
    if first in images:
        layout = str((meta["edged"].get("preprocess") or {}).get("layout", "nchw"))
        for size_name, size in size_inputs(list(specs.values()), inputs[first], layout,
                                           batched).items():
            inputs.setdefault(size_name, size)
    return inputs, images


def _batched(path: Path, array: np.ndarray, spec: TensorSpec, batched: bool) -> np.ndarray:
    """An .npy array as the model takes it: one sample without the batch dim gets one (as an
    image does); an array that is neither a sample nor a batch is an InvalidInput."""
    dims = spec.shape[1:] if batched else spec.shape

    def fits(shape: tuple[int, ...]) -> bool:
        return len(shape) == len(dims) and all(d in (-1, n) for n, d in zip(shape, dims,
                                                                          strict=True))

    if batched and fits(array.shape):
        return array[None]
    if fits(array.shape[1:] if batched else array.shape):
        return array
    wanted = f"{[-1, *dims]} or one sample {list(dims)}" if batched else f"{list(dims)}"
    raise InvalidInput(f"{path}: {spec.name} has shape {list(array.shape)}; the model takes "
                       f"{wanted}")


def _image_tensor(path: Path, model: str, pre: dict[str, object] | None, spec: TensorSpec,
                  batched: bool) -> tuple[np.ndarray, np.ndarray, Geometry]:
    """The image as the daemon's config says the model takes it: exactly its `preprocess`,
    and none guessed where it has none (PreprocessUnknown)."""
    try:
        import cv2

        from edged.processing.pre import image_preprocess, preprocess
    except ImportError as exc:
        raise InvalidInput("reading images needs OpenCV: pip install 'edged[video]'") from exc
    known = {f.name for f in dataclasses.fields(PreprocessConfig)}
    stated = None if pre is None else PreprocessConfig(
        **{k: v for k, v in pre.items() if k in known})  # type: ignore[arg-type]
    config = image_preprocess(stated, model, spec, batched)
    frame = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if frame is None:
        raise InvalidInput(f"{path}: not an image OpenCV can read")
    tensor, geometry = preprocess(frame, config, spec)
    return frame, tensor, geometry


def cmd_quantize(args: argparse.Namespace) -> int:
    from edged.ops.quantize.command import run

    return run(args)


def cmd_ota(args: argparse.Namespace) -> int:
    from edged.ops import keys

    if args.ota_command == "keygen":
        public, key_id = keys.keygen(args.key)
        print(f"private key: {args.key} (keep it off the devices)\npublic key:  {public} "
              f"(list it in ota.trusted_keys)\nkey_id:      {key_id}")
        return 0
    if args.ota_command == "mender-artifact":
        from edged.ops.mender import run

        return run(args)
    if args.ota_command in ("push", "rollback", "decide"):
        from edged.ops import push

        broker = push.Broker.parse(args.broker, username=args.username,
                                   password_file=args.password_file, ca_file=args.ca_file)
        target = push.Target.of(args.device, args.fleet, args.group, args.watch, args.expect)
        if args.ota_command == "push" and args.waves:
            from edged.ops.waves import push_waves

            return push_waves(args.manifest, broker, waves=args.waves, devices=args.device,
                              fleet=args.fleet, watch=args.watch, key=args.key,
                              artifact=args.artifact, serve_at=args.serve,
                              url_host=args.url_host, inline=args.inline,
                              timeout_s=args.timeout, ttl_s=args.ttl,
                              rollback_on_halt=args.rollback_on_halt)
        if args.ota_command == "decide":
            return push.decide(args.model, args.promote, broker, target, args.key,
                               version=args.version, timeout_s=args.timeout, ttl_s=args.ttl)
        if args.ota_command == "rollback":
            return push.rollback(args.model, broker, target, args.key,
                                 from_version=args.from_version, timeout_s=args.timeout,
                                 ttl_s=args.ttl)
        return push.push(args.manifest, broker, target, key=args.key, artifact=args.artifact,
                         serve_at=args.serve, url_host=args.url_host, inline=args.inline,
                         retain=args.retain, timeout_s=args.timeout, ttl_s=args.ttl)
    signed = keys.sign(args.manifest, args.key, args.artifact, target=args.target,
                       ttl_s=args.ttl, seq=args.seq)
    if "target" not in signed:
        print("warning: signed without --target: devices refuse it as stale (no target, seq "
              "and expires) unless ota.allow_unsigned", file=sys.stderr)
    text = json.dumps(signed, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0
