"""Correctness: the run against onnxruntime, step by step, and disagreements judged against float64."""
