"""Operating a cluster: ``compileq doctor`` and ``compileq explain``."""
