"""Text-line crops rendered by OpenCV, upright or rotated 180°: the PP-OCR direction
classifier's real task (its labels are ['0', '180']), for calibration and held-out sets made
without downloading anything."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

FONTS = (cv2.FONT_HERSHEY_SIMPLEX, cv2.FONT_HERSHEY_DUPLEX, cv2.FONT_HERSHEY_COMPLEX,
         cv2.FONT_HERSHEY_TRIPLEX, cv2.FONT_HERSHEY_PLAIN)
WORDS = ("invoice", "total", "amount", "date", "paid", "order", "number", "street", "city",
         "price", "quantity", "tax", "receipt", "name", "address", "phone", "delivery",
         "account", "balance", "2024", "1234", "0815", "EUR", "USD", "No.", "ID")
UPRIGHT, ROTATED = 0, 1  # PP-OCR cls label_list ['0', '180']

# PP-OCR cls input: BGR, height 48, width up to 192 (right-padded with 0 after normalising,
# i.e. mid-grey pixels), (pixel / 255 - 0.5) / 0.5.
PPOCR_CLS_PREPROCESS = ("preprocess: {resize: [192, 48], keep_ratio: true, pad: end, "
                        "pad_value: 127.5, color: bgr, mean: [0.5], std: [0.5]}")


def render_line(rng: np.random.Generator) -> np.ndarray:
    """One dark-on-light text line (BGR), a few words in a random Hershey font, scale and
    weight, with sensor noise and sometimes blur; roughly 1.5:1 to 8:1 wide."""
    text = " ".join(rng.choice(WORDS, int(rng.integers(1, 4))))
    font = int(rng.choice(FONTS))
    scale = float(rng.uniform(0.8, 1.4))
    thickness = int(rng.integers(1, 3))
    (width, height), baseline = cv2.getTextSize(text, font, scale, thickness)
    pad = int(rng.integers(2, 8))
    paper, ink = int(rng.integers(170, 256)), int(rng.integers(0, 90))
    shape = (height + baseline + 2 * pad, width + 2 * pad, 3)
    image: np.ndarray = np.clip(paper + rng.normal(0, 4, shape), 0, 255).astype(np.uint8)
    cv2.putText(image, text, (pad, pad + height), font, scale, (ink, ink, ink), thickness,
                cv2.LINE_AA)
    if rng.random() < 0.5:
        image = cv2.GaussianBlur(image, (3, 3), 0)
    return image


def render_set(count: int, seed: int) -> list[tuple[np.ndarray, int]]:
    """`count` (image, label) pairs, about half of them rotated 180°."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        image, label = render_line(rng), int(rng.integers(0, 2))
        out.append((cv2.rotate(image, cv2.ROTATE_180) if label == ROTATED else image, label))
    return out


def write_set(folder: Path, count: int, seed: int) -> Path:
    """PNG files in class folders `folder/0/` (upright) and `folder/1/` (rotated), the layout
    `edged quantize --held-out` reads labels from."""
    for i, (image, label) in enumerate(render_set(count, seed)):
        path = folder / str(label) / f"line{i:04d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(path), image)
    return folder
