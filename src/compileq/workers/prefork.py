"""What a worker's main process does before Celery forks its pool processes.

Everything done here once is inherited by every pool process, in memory they share (the main
process freezes it out of the collector's sight just before the fork): torch, Inductor and
Triton imported, Inductor's and Triton's keys computed, Inductor's code generators imported.
Nothing here may ask CUDA anything (``cuda_fork`` checks the fork after it).
"""

from __future__ import annotations

import importlib

from compileq._log import log


def preload(cpu_only: bool) -> None:
    """Import torch, Inductor and Triton once, before Celery forks its pool processes."""
    if cpu_only:
        from compileq.build.triton import enable_cross_compile

        enable_cross_compile()
    import torch._inductor.async_compile
    import torch._inductor.codecache
    import torch._inductor.compile_fx_ext
    import torch._inductor.runtime.triton_heuristics  # noqa: F401

    from compileq.fingerprint import seed_inductor_keys
    from compileq.hooks.ledger import Patches

    # Before the fork, or each pool process's first graph hashes again; in the ledger, and
    # never undone: a worker's process compiles for its whole life.
    # Triton's own key first: the seeding then points its compiler at the memo, and the
    # function Triton's autotuner bound at import is the one filled.
    prime_triton_key()
    seed_inductor_keys(Patches("worker-keys").set)
    prime_codegen()


def prime_triton_key() -> None:
    """Compute Triton's own ``triton_key()`` before the fork, as stock's compile pool does
    (``pre_fork_setup``). Triton's compiler keys every kernel on it, and it is an
    ``lru_cache`` per process that hashes Triton's compiler and libtriton (0.3-0.4 s): computed
    here once, every pool process inherits it; else each pays it at its first kernel.
    Computed, not only seeded from compileq's memo (``fingerprint._seed_triton_compiler``
    points the compiler's name at it next): Triton's autotuner binds the function at import,
    so the real one is what it must find filled."""
    try:
        from triton.runtime.cache import triton_key
    except ImportError:  # no Triton, or one whose key lives elsewhere: each process computes it
        return
    try:
        triton_key()
    except Exception as e:  # a broken Triton fails its first build with its own error
        log.debug("compileq: Triton's key not computed before the fork: %s", e)


def prime_codegen() -> None:
    """Import what a pool process's first graph would import, once, before the fork.

    Inductor imports its code generators lazily, at the first graph of a process: on the CPU
    machine a fresh pool process's first codegen imported 159 modules, and its forward took
    0.5-0.9 s longer than the same pool process's next forwards of the same model at other
    widths; 0.3-0.5 s with these imported first (docs/BENCHMARKS.md, fresh pool processes).
    With a job's own workers (Slurm's train.sbatch) every graph of a cold job lands on a fresh
    pool process. Imported here, every
    pool process inherits them, in memory it shares with the others. Each is a plain import or
    registration that asks nothing of CUDA (the fork check after this would say so).
    Rejected alternative: generating a small graph here, which would cover more but start
    Inductor's compile threads (alive at the fork) and build a kernel on every first start.
    """
    try:
        from torch._inductor import cpp_builder
        from torch._inductor.codegen.common import (
            get_device_op_overrides,
            init_backend_registration,
        )

        init_backend_registration()  # every device's scheduling and wrapper code generators
        get_device_op_overrides("cpu")  # every device's op overrides, registered on first use
        # The C++ compile command: imports torch.utils.cpp_extension (setuptools) and caches
        # the include paths every C++ kernel's command line needs.
        cpp_builder.CppTorchOptions()
    except Exception as e:  # an Inductor without one of these: its first graph imports them
        log.debug("compileq: Inductor's code generators not imported before the fork: %s", e)
    for name in _FIRST_GRAPH_MODULES:
        try:
            importlib.import_module(name)
        except Exception as e:  # not in this torch: its first graph goes without
            log.debug("compileq: %s not imported before the fork: %s", name, e)


#: The rest of what a CPU graph's codegen imported in a fresh pool process on torch 2.13 (the
#: lowering's and post-grad passes' lazy imports), beyond what prime_codegen's calls import.
_FIRST_GRAPH_MODULES = (
    "torch._inductor.bounds",
    "torch._inductor.choices",
    "torch._inductor.codegen.memory_planning",
    "torch._inductor.codegen.segmented_tree",
    "torch._inductor.compiler_bisector",
    "torch._inductor.extern_node_serializer",
    "torch._inductor.fx_passes.freezing_patterns",
    "torch._inductor.fx_passes.mkldnn_fusion",
    "torch._inductor.fx_passes.quantization",
    "torch._inductor.hooks",
    "torch._inductor.kernel_template_choice",
    "torch.fx.experimental.validator",
    "sympy.physics.units",  # sympy's simplify() imports it at its first call
)
