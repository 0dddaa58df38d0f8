"""The tasks room: what a camera model does beyond boxes. Each task is recognised from the ONNX
file's outputs and metadata (`recognise`), and decodes its outputs into typed columns on the
frame's one `Detections` (`segment`: mask polygons, `keypoints`: named points) or into a
result of its own (`text`: a CTC recogniser's string). Detection's heads still live in
`edged.model.heads` (decision 034)."""
