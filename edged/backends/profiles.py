"""TensorRT optimisation profiles from what the batcher will send: batches of 1 up to
`max_batch_size`, tuned for the largest preferred batch size (exactly N rows for a graph whose
batch dim is fixed at N: the batcher pads); dynamic non-batch dims from the
ranges in `model.yaml` (`tensorrt.shapes`). The TensorRT backend builds one such profile per
execution context; ONNX Runtime's TensorRT EP takes the same shapes as provider options."""

from __future__ import annotations

from dataclasses import dataclass

from edged.backends.base import LoadSpec


class ProfileError(ValueError):
    """The model's inputs cannot be given a TensorRT profile (a dynamic dim without a range)."""


@dataclass(frozen=True)
class InputProfile:
    """min/opt/max shapes of one input, batch dim included when the model is batched."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "min": list(self.min), "opt": list(self.opt),
                "max": list(self.max)}


def opt_batch_size(max_batch_size: int, preferred: list[int] | tuple[int, ...]) -> int:
    """The batch size to tune for: the largest preferred size that fits, else the maximum."""
    fitting = [p for p in preferred if 1 <= p <= max_batch_size]
    return max(fitting) if fitting else max_batch_size


def derive_profile(spec: LoadSpec) -> tuple[InputProfile, ...]:
    """One profile covering every request the batcher can send `spec`'s model."""
    unknown = sorted(set(spec.shape_ranges) - {t.name for t in spec.inputs})
    if unknown:
        raise ProfileError(f"{spec.label}: tensorrt.shapes names {', '.join(unknown)}, which "
                           f"the model does not take as input")
    batched = spec.max_batch_size > 0
    opt = min(max(spec.opt_batch_size or spec.max_batch_size, 1), max(spec.max_batch_size, 1))
    # A graph with a fixed batch dim is only ever sent that many rows (the batcher pads).
    fixed = spec.fixed_batch
    batch = (fixed, fixed, fixed) if fixed else (1, opt, spec.max_batch_size)
    profile = []
    for tensor in spec.inputs:
        dims = tensor.shape[1:] if batched else tensor.shape
        low, mid, high = _dims_range(spec, tensor.name, tuple(dims))
        if batched:
            low, mid, high = (batch[0], *low), (batch[1], *mid), (batch[2], *high)
        profile.append(InputProfile(tensor.name, low, mid, high))
    return tuple(profile)


def _dims_range(spec: LoadSpec, name: str, dims: tuple[int, ...]
                ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(min, opt, max) of an input's non-batch dims: fixed dims as they are, dynamic ones from
    the model's range, which must agree with the fixed ones."""
    given = spec.shape_ranges.get(name)
    if given is None:
        dynamic = [i for i, d in enumerate(dims) if d < 0]
        if dynamic:
            raise ProfileError(
                f"{spec.label}: input {name} has dynamic dims {dynamic} (of {list(dims)}) and "
                f"model.yaml gives no tensorrt.shapes.{name} range (min/opt/max) for them")
        return dims, dims, dims
    for which in ("min", "opt", "max"):
        shape = getattr(given, which)
        if len(shape) != len(dims) or any(d >= 0 and s != d for s, d in zip(shape, dims,
                                                                              strict=True)):
            raise ProfileError(f"{spec.label}: tensorrt.shapes.{name}.{which} {list(shape)} "
                               f"does not fit the input's dims {list(dims)}")
    if not all(lo <= mid <= hi for lo, mid, hi in zip(given.min, given.opt, given.max,
                                                       strict=True)):
        raise ProfileError(f"{spec.label}: tensorrt.shapes.{name} needs min <= opt <= max "
                           f"in every dim")
    return given.min, given.opt, given.max


def ort_trt_profile_options(profile: tuple[InputProfile, ...]) -> dict[str, str]:
    """The profile as ONNX Runtime TensorRT EP options ("name:1x3x8x8,other:...")."""
    def shapes(which: str) -> str:
        return ",".join(f"{p.name}:{'x'.join(str(d) for d in getattr(p, which))}"
                        for p in profile)

    if not profile:
        return {}
    return {"trt_profile_min_shapes": shapes("min"), "trt_profile_opt_shapes": shapes("opt"),
            "trt_profile_max_shapes": shapes("max")}
