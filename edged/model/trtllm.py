"""A TensorRT-LLM model folder (a version's `trtllm/`: an engine built by trtllm-build, or a
checkpoint): what edged reads of it before a backend sees it, its config.json's sizes, so a
folder that cannot tell them is an InvalidModel when the version is read."""

from __future__ import annotations

import json
from pathlib import Path

from edged.core.errors import InvalidModel

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "fp8": 1, "int8": 1}


def kv_bytes_per_token(folder: Path) -> int:
    """From the folder's config.json (an engine's `pretrained_config`, or a checkpoint's own):
    keys and values of every layer for one token, in the model's dtype."""
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise InvalidModel(f"{folder}: no readable config.json: {exc}") from exc
    config = raw.get("pretrained_config", raw)
    try:
        layers = int(config["num_hidden_layers"])
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidModel(f"{folder / 'config.json'}: cannot tell the KV cache's size "
                           f"(layers, hidden size, heads): {exc}") from exc
    dtype = str(config.get("dtype") or config.get("torch_dtype") or "float16")
    return 2 * layers * kv_heads * (hidden // heads) * DTYPE_BYTES.get(dtype, 2)
