"""`edged quantize`: calibration samples, ONNX Runtime static quantization (QDQ) and the
accuracy gate whose report (`edged.model.int8_report`) decides whether the device may load
the INT8 variant."""
