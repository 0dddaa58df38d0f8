"""What the tests share, one module per room: `backends` (test backend options, a gate around
real ONNX Runtime sessions), `models` (model.yaml edits, marked inputs, a Q/DQ model), `broker`
(a private mosquitto and a subscriber), `daemon` (the daemon served in-process), `artifacts`
(an HTTP artifact server for OTA), `ota` (signing keys and a manifest pusher), `notify` (a
stand-in for systemd's NOTIFY_SOCKET), `polling` (wait_until: bounded waits for state that can
only be read), `ports` (free_port: reserved loopback ports for servers that need a number).

Imported as `support.<module>`: pytest puts `tests/` on sys.path for its rootdir conftest, as
it does for `doubles`. The fixtures defined here are registered by `tests/conftest.py`
(`pytest_plugins`); tests import only classes and functions, and never from conftest."""
