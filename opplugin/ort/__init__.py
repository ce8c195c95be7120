"""onnxruntime: the sessions every layer shares, and the reference that runs the model as loaded."""
