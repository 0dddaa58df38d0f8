"""Frames to tensors (`pre`) and tensors to results (`post`)."""
