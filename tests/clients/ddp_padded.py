"""``examples/llama_script.py`` with Inductor padding strides on the CPU as it does on a GPU
(``disable_padding_cpu`` off): at a width whose rows are over 1024 elements and not a multiple
of 128 bytes, Inductor pads the saved activations of each DDP forward, so they come back from
the worker with other strides than the traced ones (codegen/deferred.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import llama_script

torch._inductor.config.disable_padding_cpu = False

if __name__ == "__main__":
    llama_script.main()
