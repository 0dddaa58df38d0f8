"""Event descriptions (issue 52, decision 039): when an object's event ends, its best snapshot
and its data go to a describer off the frame path (edged's own language model, or an
OpenAI-compatible endpoint), which answers Frigate's review-summary JSON, validated against
its schema, published and kept with the event."""
