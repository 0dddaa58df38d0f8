"""What the device reads of an INT8 variant: the gate's report (`edged quantize` makes both)."""
