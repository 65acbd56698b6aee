"""On PYTHONPATH for ``bench.ddp``'s ``stock_cold_keep``: stock torch.compile, with only compileq's
stack-chunk keeper (compileq/stack_chunks.py) installed in each process, to tell its share of a
compileq run's gain from the rest."""

from compileq import stack_chunks

stack_chunks.keep()
