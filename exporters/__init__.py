"""Writing rm-qdrant encoder graphs (ONNX) with the metadata the runtime reads."""
