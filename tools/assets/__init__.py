"""The checkout's assets, generated, never committed: the tiny ONNX test models
(`tools.assets.models`, written with `onnx.helper`) and the demo's videos and models
(`tools.assets.demo`). Tests, benchmarks, the GPU self-test and `make run` import them one
way, `from tools.assets import ...`; `python -m tools.assets.models DIR` and
`python -m tools.assets.demo DIR` write them from the command line."""
