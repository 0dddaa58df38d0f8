"""Running models: load specs, precision and thread choices, instances, the loader, the warm
cache, dynamic batching and the scheduler every caller submits to."""
