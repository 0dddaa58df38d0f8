"""CTC text recognisers (PP-OCR rec, CRNN): [N, T, C] per-step class probabilities over a
character set with the CTC blank first (class 0) and, where the width says so, a space last
(PaddleOCR's `use_space_char`), read greedily as PaddleOCR's `CTCLabelDecode` reads them: the
best class per step, repeats merged, blanks dropped; the score is the mean of the kept steps'
probabilities (0 when nothing is read)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edged.core.errors import InvalidModel

BLANK = 0


def charset(characters: Sequence[str] | None, width: int, where: str) -> list[str]:
    """The classes of a CTC output `width` wide: blank, the characters, and a space when the
    width has room for one. InvalidModel when the character set does not fit the width."""
    if not characters:
        raise InvalidModel(f"{where}: a text recogniser needs its character set (metadata "
                           f"character, postprocess.names, or a labels file)")
    if width == len(characters) + 1:
        return ["", *characters]
    if width == len(characters) + 2:
        return ["", *characters, " "]
    if width <= 0:  # a dynamic class dim: told per frame
        return ["", *characters]
    raise InvalidModel(f"{where}: {len(characters)} characters do not fit the output's "
                       f"{width} classes (a CTC recogniser has the blank and the characters, "
                       f"and a space where it reads them: {len(characters) + 1} or "
                       f"{len(characters) + 2})")


def ctc_decode(probs: np.ndarray, characters: Sequence[str]) -> list[tuple[str, float]]:
    """One (text, score) per row of `probs` [N, T, C] (or [T, C])."""
    steps = np.asarray(probs, np.float32)
    if steps.ndim == 2:
        steps = steps[None]
    if steps.ndim != 3:
        raise InvalidModel(f"text: expected [N, T, C] class probabilities, got "
                           f"{list(steps.shape)}")
    classes = charset(characters, steps.shape[2], "text")
    best = steps.argmax(axis=2)
    prob = steps.max(axis=2)
    read = []
    for index, score in zip(best, prob, strict=True):
        kept = np.ones(len(index), bool)
        kept[1:] = index[1:] != index[:-1]
        kept &= index != BLANK
        text = "".join(classes[i] for i in index[kept].tolist())
        mean = float(score[kept].mean()) if kept.any() else 0.0
        read.append((text, mean if np.isfinite(mean) else 0.0))  # never NaN in JSON
    return read
