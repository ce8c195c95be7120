"""The load-time rewrites of a model's graph, each a function over one graph type, run in one ordered list (graph/simplify.py)."""
