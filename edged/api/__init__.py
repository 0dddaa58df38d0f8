"""The local inference API: the KServe v2 / Triton HTTP protocol over a Unix socket."""
