"""The operator's side of edged: the client and the commands that call a running daemon, OTA
signing and pushing, INT8 quantization. It imports the runtime; the runtime never imports it."""
