"""The model as a graph: loading and checking it, shape inference, and the load-time passes that rewrite it."""
