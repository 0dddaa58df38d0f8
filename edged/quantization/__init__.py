"""INT8 variants of a model: calibration samples, ONNX Runtime static quantization (QDQ) and the
accuracy gate that decides whether the variant may be loaded (`edged quantize`)."""
