"""Being a good systemd service: readiness and the watchdog, health, Prometheus metrics, the
stats message and status report, and reloads."""
