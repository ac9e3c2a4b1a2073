"""Robust variational inference: the Gaussian q of a generalized posterior (``robust_vi.py``),
over rows held in partitions (``partitioned.py``), and the influence of a training point on a
test log-likelihood by refitting (``influence.py``)."""
