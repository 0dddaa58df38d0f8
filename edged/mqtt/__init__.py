"""The MQTT link (TLS/auth, last will, offline buffer, inbound dispatch) and every topic edged
publishes or takes."""
