"""edged's device check: the GPU paths of the daemon run for real on this machine, each as a
row that passes, fails or is skipped with its reason (`tools/gpu_selftest.py` runs them)."""
