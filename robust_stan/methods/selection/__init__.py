"""Choosing the divergence (``divergence.py``: the H-score and the MSE criterion over a grid) and
calibrating a generalized posterior (``calibration.py``: its learning rate and its spread)."""
