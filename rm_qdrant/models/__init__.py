"""Encoders: ONNX Runtime sessions, image decoding, and stamping a team's graph."""
