"""The load-time rewrites of a model's graph, each a function over the one graph type (graph/ir.py), run in one ordered list
(graph/simplify.py)."""
