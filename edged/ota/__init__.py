"""Over-the-air model updates: manifests, artifact delivery, install, rollback, MQTT glue."""
