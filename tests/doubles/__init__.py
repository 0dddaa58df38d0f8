"""Small test doubles of the GPU libraries edged calls (`cuda.bindings.runtime`, `tensorrt`),
modelling the API surface it uses, installed into `sys.modules` by the tests."""
