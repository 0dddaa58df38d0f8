"""The galleries room: embeddings enrolled under names (and negatives: "this face is not X"),
matched by cosine similarity; unmatched embeddings grouped by similarity so that a person can
name a group once. One SQLite file per device under the daemon's state folder; vectors are
float32 blobs, each row carrying the embedder (model:version) that made it and, where it has
one, the aligned crop it was made from, so that a new embedder can re-embed the gallery.
Imports only `core`: the face pipeline (`edged.streams.faces`) feeds it vectors."""
