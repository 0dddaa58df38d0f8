"""One stream's pipeline from frame to published result: the only room that calls the others for
a frame (sources, processing, inference, events), and the set of streams the daemon runs."""
