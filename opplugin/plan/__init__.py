"""Planning: the model cut into plugin steps and onnxruntime steps, with the fusions each plugin takes."""
