"""The tasks room: what a camera model does beyond boxes. Each task is recognised from the ONNX
file's outputs and metadata (`recognise`), and decodes its outputs into typed columns on the
frame's one `Detections` (`segment`: mask polygons, `keypoints`: named points) or into a
result of its own (`text`: a CTC recogniser's string); `warp` makes four corners an upright
crop, `rle` a mask COCO's run-length encoding. Detection's heads still live in
`edged.model.heads` (decision 034)."""

# The tasks whose results are detections (boxes, with masks or keypoints for the last two):
# streams track them, cascades crop them, shadows judge them by their boxes.
BOXED_TASKS = ("detect", "segment", "pose")
