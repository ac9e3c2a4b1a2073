"""Gradients: a model's compiled program, its log density and gradient oracles, per-example gradients."""
