"""compileq's version (``compileq.__version__``), in a base module of its own.

Modules of every layer read it (a graph's failure verdict is keyed by it: cache/verdicts.py),
and importing it from the package's ``__init__`` would have them import ``compileq`` itself,
which reaches ``features`` above them (the layers contract).
"""

from __future__ import annotations

__version__ = "0.1.0"
