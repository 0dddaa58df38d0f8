"""What a model is on the device: the repository on disk, `model.yaml`'s schema, the ONNX
signature, tensor specs, which file and precision a load uses, and what a backend is handed.
(Kept import-free: backends import `edged.model.tensor` without pulling in the repository.)"""
