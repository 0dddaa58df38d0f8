"""The evidence: the camera's own packets kept in a per-stream pre-capture ring, event clips
remuxed from them into MP4 (never re-encoded), the clip store on disk with its byte budget, its
free-space floor and its repair at start."""
