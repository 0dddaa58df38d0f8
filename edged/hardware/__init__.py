"""What the machine has: the CUDA runtime, buffer pools (host, pinned, mapped, managed, device),
and host and Jetson telemetry."""
