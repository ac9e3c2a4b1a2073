"""DP-VI: the private mechanism (``mechanism.py``), its privacy accounting (``accounting.py``), the
random numbers that protect it (``randomness.py``), the noise-aware posterior of its release
(``noise_aware.py``) and the mechanism over rows held in partitions (``partitioned.py``)."""
