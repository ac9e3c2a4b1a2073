"""Rob-ULA: the sampler (``sampler.py``), its robust mean estimators (``estimators.py``) and its
steps over rows held in partitions (``partitioned.py``)."""
