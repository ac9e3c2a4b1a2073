"""Coresets: greedy construction (``construction.py``), what it asks of a model (``targets.py``)
and the targets over rows held in partitions (``partitioned.py``)."""
