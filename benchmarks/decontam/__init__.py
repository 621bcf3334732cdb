"""The decontamination benchmark's shapes of task: generators by kind (``natural``: from the standard
library; ``records`` and ``prose``: synthetic), the helpers they share (``base``, ``stdlib``), the
registry of every shape (``registry``) and the measurement (``measure``). Run by
``benchmarks/decontamination.py``.
"""
