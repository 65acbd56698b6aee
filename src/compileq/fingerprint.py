"""What makes two builds of the same kernel source interchangeable.

A compiled kernel depends on its source, the *target* it was built for (read from the
``DeviceProperties`` Inductor writes into every kernel source) and the *toolchain* that built
it (torch and Triton sources, the assembler, and the environment variables that change
codegen). Cache keys and queue names are both derived from these, so a worker only ever
receives kernels its toolchain builds bit-for-bit like the client's would.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from compileq._files import write_atomically
from compileq._log import log
from compileq.errors import UnsupportedTarget

_DEVICE_PROPS = re.compile(r"DeviceProperties\(([^)]*)\)")
_FIELD = re.compile(r"(\w+)=('[^']*'|\"[^\"]*\"|[\w.]+)")
_ARCH_FLAG = re.compile(r"^sm_?(\d+)a?$")

#: Triton variables that only say where files go or what is logged: they never change a cubin,
#: so they stay out of the fingerprint (a client and a worker with different cache dirs must match).
_ENV_NOT_CODEGEN = frozenset(
    {
        "TRITON_CACHE_DIR",
        "TRITON_HOME",
        "TRITON_DUMP_DIR",
        "TRITON_OVERRIDE_DIR",
        "TRITON_CACHE_MANAGER",
        "TRITON_REMOTE_CACHE_BACKEND",
        "TRITON_PRINT_AUTOTUNING",
        "TRITON_LIBDEVICE_PATH",  # a path; jobs that carry it are built locally (see jobs.py)
        "TRITON_PTXAS_PATH",  # a path; the assembler's version is fingerprinted instead
        "TRITON_PTXAS_BLACKWELL_PATH",
    }
)


@dataclass(frozen=True, order=True)
class Target:
    """A GPU target: ``cuda-90-w32`` is compute capability 9.0 with 32-wide warps."""

    backend: str
    arch: str
    warp_size: int

    def __str__(self) -> str:
        return f"{self.backend}-{self.arch}-w{self.warp_size}"

    @classmethod
    def from_source(cls, source: str) -> Target | None:
        """The target named by the ``DeviceProperties(...)`` inside an Inductor kernel source."""
        match = _DEVICE_PROPS.search(source)
        if match is None:
            return None
        fields = {k: v.strip("'\"") for k, v in _FIELD.findall(match.group(1))}
        backend, arch, warp = fields.get("type"), fields.get("cc"), fields.get("warp_size")
        if not backend or not arch or not warp or not warp.isdigit():
            return None
        return cls(backend, arch, int(warp))

    @classmethod
    def parse(cls, text: str) -> Target:
        """Parse ``sm_90`` / ``sm90`` (CUDA, 32-wide warps) or the canonical ``cuda-90-w32``."""
        text = text.strip()
        if m := _ARCH_FLAG.match(text):
            return cls("cuda", m.group(1), 32)
        parts = text.rsplit("-", 2)
        if len(parts) == 3 and parts[2].startswith("w") and parts[2][1:].isdigit():
            return cls(parts[0], parts[1], int(parts[2][1:]))
        raise UnsupportedTarget(
            f"cannot read target {text!r}: use sm_<cc> (for example sm_90) or backend-arch-wN "
            f"(for example cuda-90-w32)"
        )


@dataclass(frozen=True)
class Toolchain:
    """The build tools of one machine for one target; equal toolchains build equal kernels."""

    torch_version: str
    torch_key: str
    triton_version: str
    triton_key: str
    assembler: str
    codegen_env: tuple[tuple[str, str], ...]

    @functools.cached_property
    def digest(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:20]

    def describe(self) -> dict[str, Any]:
        return {**asdict(self), "codegen_env": dict(self.codegen_env), "digest": self.digest}


def flatten(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level of dotted names: ``{"codegen_env": {"TRITON_X": "1"}}`` becomes
    ``{"codegen_env.TRITON_X": "1"}``, so a difference names the variable, not the whole env."""
    out: dict[str, Any] = {}
    for name, item in value.items():
        if isinstance(item, Mapping):
            out.update(flatten(item, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = item
    return out


def differences(mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """Names whose values differ between two descriptions (a name one side lacks counts).

    Digests are left out: one differs whenever any component does, so naming it says nothing.
    The one comparison behind routing warnings, ``compileq doctor`` and ``compileq explain``.
    """
    names = [*mine, *(n for n in theirs if n not in mine)]
    return [
        n
        for n in names
        if n != "digest" and not n.endswith(".digest") and mine.get(n) != theirs.get(n)
    ]


def codegen_env(environ: dict[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """``TRITON_*`` variables that can change generated code, sorted."""
    env = os.environ if environ is None else environ
    return tuple(
        sorted(
            (k, v) for k, v in env.items() if k.startswith("TRITON_") and k not in _ENV_NOT_CODEGEN
        )
    )


def _cache_file() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "compileq" / "toolchain.json"


def _stat_signature(root: str, suffixes: tuple[str, ...]) -> str:
    """Hash of (path, size, mtime) of every file under ``root`` with one of ``suffixes``."""
    digest = hashlib.sha256()
    stack = [root]
    while stack:
        for entry in sorted(os.scandir(stack.pop()), key=lambda e: e.name):
            if entry.is_dir(follow_symlinks=False) and entry.name != "__pycache__":
                stack.append(entry.path)
            elif entry.name.endswith(suffixes):
                st = entry.stat()
                digest.update(f"{entry.path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _memoised(name: str, signature: str, compute: Callable[[], str]) -> str:
    """``compute()``, remembered on disk for as long as ``signature`` holds.

    torch_key and triton_key hash every source file of torch and Triton and libtriton itself,
    0.7 s per process on a small machine, paid by every ``compileq warm``. Their inputs change
    only when files change, and a file's size or mtime changes with it, so a signature of
    stats (a few ms) stands in for the content hash; any change recomputes it.
    """
    path = _cache_file()
    try:
        memo = json.loads(path.read_text())
    except (OSError, ValueError):
        memo = {}
    if not isinstance(memo, dict):
        memo = {}
    entry = memo.get(name)
    if isinstance(entry, dict) and entry.get("signature") == signature:
        return str(entry["value"])
    value = compute()
    memo[name] = {"signature": signature, "value": value}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(memo).encode())  # a concurrent reader: never half
    except OSError:
        pass  # an unwritable home only costs the recomputation next time
    return value


@functools.cache
def torch_identity() -> tuple[str, str]:
    """``(torch version without local label, torch_key)``, memoised on disk."""
    import torch

    def compute() -> str:
        from torch._inductor.codecache import torch_key

        return str(torch_key().hex())

    root = os.path.dirname(torch.__file__)
    signature = _stat_signature(root, (".py", ".cpp", ".ld"))
    # The local version label (+cpu, +cu130) is dropped: a CPU build cross-compiles the same
    # Inductor sources to the same cubins, which is what lets --cpu-only workers serve GPU clients.
    return torch.__version__.split("+")[0], _memoised("torch_key", signature, compute)


@functools.cache
def _triton_key() -> str:
    """Triton's own ``triton_key()`` (its version and a hash of its compiler, backends and
    libtriton), memoised on disk: Inductor hashes those files in every process."""
    import triton

    def compute() -> str:
        # Inductor's cached one where torch has it (2.13; computed here, this process's
        # Inductor has it too), else Triton's own (2.11, which Inductor calls directly).
        from torch._inductor import codecache
        from torch._inductor.runtime import triton_compat

        return str(getattr(codecache, "triton_key", triton_compat.triton_key)())

    root = os.path.dirname(triton.__file__)
    return _memoised("triton_key_raw", _stat_signature(root, (".py", ".so")), compute)


@functools.cache
def _triton_identity() -> tuple[str, str]:
    import triton

    return triton.__version__, hashlib.sha256(_triton_key().encode()).hexdigest()


def seed_inductor_keys(set_attr: Callable[[Any, str, Any], object] = setattr) -> list[str]:
    """Hand Inductor this process's ``torch_key`` and ``triton_key`` from the on-disk memo.

    ``set_attr`` makes the one replacement of torch's this needs on torch 2.11
    (:func:`_seed_triton_compat`): a ``Patches.set`` of the ledger's, so that it is undone with
    the feature that asked (``features.InductorKeys``, a worker's ``prefork``).

    Inductor computes both at a process's first compile, by hashing every source file of torch
    and Triton and libtriton itself (0.5-0.8 s on the 2-core CPU machine, in the first step of
    every process, warm caches or not, and in every worker pool process's first graph). torch
    2.13 keeps them in a ``prefetchable_cache`` with ``set()`` for exactly this; on a torch
    whose cache has no ``set`` nothing is seeded, except Triton's key on torch 2.11, which
    Inductor reads through ``triton_compat`` there (:func:`_seed_triton_compat`). Returns the
    names seeded. Never raises: a memo that cannot be read or written only costs the hashing.
    """
    seeded: list[str] = []
    try:
        from torch._inductor import codecache
        from torch._inductor.runtime.triton_compat import HAS_TRITON

        values: dict[str, Callable[[], object]] = {
            "torch_key": lambda: bytes.fromhex(torch_identity()[1])
        }
        if HAS_TRITON:
            values["triton_key"] = _triton_key
        for name, value in values.items():
            setter = getattr(getattr(codecache, name, None), "set", None)
            if setter is None and name == "triton_key":
                setter = functools.partial(_seed_triton_compat, set_attr=set_attr)
            if setter is None:
                continue
            try:
                setter(value())
            # Computed already in this process (or by the memo's compute): 2.13 raises a
            # RuntimeError, 2.11 asserts.
            except (RuntimeError, AssertionError):
                continue
            seeded.append(name)
        if HAS_TRITON:
            try:
                _seed_triton_compiler(_triton_key(), set_attr)
                seeded.append("triton_compiler_key")
            except RuntimeError:  # seeded already
                pass
    except Exception:
        log.debug("compileq: Inductor's keys not seeded", exc_info=True)
    return seeded


def _seed_triton_compat(value: str, set_attr: Callable[[Any, str, Any], object] = setattr) -> None:
    """torch 2.11's Inductor has no ``triton_key`` cache of its own: its ``get_system`` (in
    every FX-graph and AOTAutograd cache key, so in every first compile) imports ``triton_key``
    from ``triton_compat`` at each call, and that is Triton's own ``lru_cache``, which hashes
    Triton's compiler, backends and libtriton (0.3-0.4 s on the H100, in every process). An
    ``lru_cache`` cannot be filled from outside, so ``triton_compat``'s name is pointed at the
    memoised value instead; anything that bound Triton's function before computes it itself,
    to the same value."""
    from torch._inductor.runtime import triton_compat

    _point_at_memo(triton_compat, value, "triton_key", set_attr)


def _seed_triton_compiler(
    value: str, set_attr: Callable[[Any, str, Any], object] = setattr
) -> None:
    """Triton's key where Triton's compiler reads it: ``triton.compile`` keys its file cache
    on ``get_cache_key``, which calls ``triton.runtime.cache.triton_key`` through that
    module's globals, and that is an ``lru_cache`` that hashes Triton's compiler, backends and
    libtriton. A client seldom compiles a kernel itself, but a graph loaded warm can: a
    reduction whose config spills registers is built again with a smaller block as it is
    loaded (``CachingAutotuner._dynamic_scale_rblock``). On a new machine that first compile
    of the process hashed Triton's files, 0.38 s of GoogleFnet's 2.34 s first step (H200,
    torch 2.11, cProfile: ``bench/zoo_profile_device.sh``); stock's warm local cache had
    hashed them already, for its FX key, which compileq seeds instead. The name is pointed at
    the memoised value, as Triton's own compile-warmup workers point it at their parent's
    (``_compile_warmup_pool``); what bound the function at import (Triton's autotuner)
    computes it itself, to the same value. ``__wrapped__``: Triton's own function."""
    from triton.runtime import cache

    _point_at_memo(cache, value, "Triton's compiler key", set_attr)


def _point_at_memo(
    module: Any, value: str, what: str, set_attr: Callable[[Any, str, Any], object]
) -> None:
    """``module.triton_key`` pointed at ``value``, marked seeded, with the function it replaces
    as ``__wrapped__``; a RuntimeError where it is seeded already."""
    current = module.triton_key
    if getattr(current, "_compileq_seeded", False):
        raise RuntimeError(f"{what} is seeded already")

    def triton_key() -> str:
        return value

    triton_key._compileq_seeded = True  # type: ignore[attr-defined]
    triton_key.__wrapped__ = current  # type: ignore[attr-defined]
    set_attr(module, "triton_key", triton_key)


def use_torch_ptxas() -> None:
    """Point Triton at torch's bundled ptxas now, as Inductor does before every build.

    Inductor writes a ``backend_hash`` into every Triton kernel's source: a hash of Triton's key
    and the ptxas version Triton reports, cached at the process's first graph. A worker has
    pointed Triton at torch's ptxas before it generates anything (its toolchain asks
    :func:`assembler_version`); a client had not, so on the H100 the same graph generated in a
    client and on a worker gave every kernel two sources, two keys, and nothing shared. Called
    at install, before the first graph. Never raises."""
    try:
        from torch._inductor.runtime.compile_tasks import _set_triton_ptxas_path

        _set_triton_ptxas_path()
    except Exception:
        log.debug("compileq: Triton not pointed at torch's ptxas", exc_info=True)


def assembler_version(target: Target) -> str:
    """The version of the assembler a build for ``target`` runs now (ptxas for CUDA).

    Resolved on every call, not cached: Inductor points Triton at torch's bundled ptxas only
    when it first compiles (``_set_triton_ptxas_path``), and Triton's own ``get_ptxas_version``
    is cached per process, so in a training process it can report the ptxas that was current
    before that switch, not the one a build uses. Only the ``--version`` call is cached, by path.
    """
    if target.backend != "cuda":
        return f"{target.backend}:unknown"
    from torch._inductor.runtime.compile_tasks import _set_triton_ptxas_path
    from triton.backends.nvidia import compiler as nv

    _set_triton_ptxas_path()  # what _worker_compile_triton does before every build
    tool = nv.get_ptxas(int(target.arch))
    path = tool[0] if isinstance(tool, tuple) else tool.path  # older Triton returns (path, ver)
    return _tool_version(str(path))


@functools.cache
def _tool_version(path: str) -> str:
    text = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    release = [ln for ln in lines if "release" in ln or ln.startswith("Build")]
    return " | ".join(release or lines[-1:])


def local_toolchain(target: Target) -> Toolchain:
    """This process's toolchain for ``target`` (the expensive parts are computed once)."""
    torch_version, tkey = torch_identity()
    triton_version, trkey = _triton_identity()
    return Toolchain(
        torch_version=torch_version,
        torch_key=tkey,
        triton_version=triton_version,
        triton_key=trkey,
        assembler=assembler_version(target),
        codegen_env=codegen_env(),
    )


# -- FX codegen --------------------------------------------------------------------------------
#
# Codegen of a whole graph depends on more than a Triton build does: on CPU the C++ Inductor
# writes follows the vector ISAs the CPU runs (``cpu_vec_isa``), and the object is built by the
# host compiler; a graph touching a GPU also needs the GPU's kernel toolchain. A worker serves
# an FX queue only where all of these equal the client's, so the code it writes is the code the
# client would have written.


@functools.cache
def compiler_identity() -> str:
    """The host C++ compiler Inductor uses, with the first line of its ``--version``."""
    from torch._inductor.cpp_builder import get_cpp_compiler

    cxx = get_cpp_compiler()
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        out = f"unknown ({e})"
    return f"{cxx}: {(out.splitlines() or ['?'])[0]}"


@functools.cache
def cpu_isas() -> str:
    """Every vector ISA Inductor finds usable here (``avx512+avx2``), or ``novec``.

    The whole list, not only Inductor's pick: the pick also follows ``config.cpp.simdlen`` and
    ``ATEN_CPU_CAPABILITY``, which travel with the job, so two machines with equal lists pick
    alike under any setting; two with equal picks but different lists may not.
    """
    from torch._inductor.cpu_vec_isa import valid_vec_isa_list

    if valid_vec_isa_list.cache_info().currsize == 0:
        _probe_in_parallel()
    names = [re.sub(r"\W+", "_", str(isa)).strip("_") for isa in valid_vec_isa_list()]
    return "+".join(n for n in names if n) or "novec"


def _probe_in_parallel() -> None:
    """Run Inductor's vector-ISA probes at once instead of one after another.

    ``valid_vec_isa_list`` compiles and loads a probe per ISA the CPU advertises, in turn:
    54.6 s of a GPU worker's 71.8 s first start on an H100 node. The probes are independent
    compiler runs (subprocesses: the GIL is free), and each ISA caches its verdict
    (``functools.cache`` on ``__bool__``), so Inductor's own sequential pass then only reads
    them. Rejected alternative: skipping the probes with Inductor's ``cpp.vec_isa_ok`` (it
    would trust an ISA the compiler or loader may refuse).
    """
    import platform
    from concurrent.futures import ThreadPoolExecutor

    from torch._inductor import cpu_vec_isa

    if platform.machine() not in ("x86_64", "AMD64"):
        return
    try:
        flags = cpu_vec_isa.x86_isa_checker()
        candidates = [
            isa
            for isa in cpu_vec_isa.supported_vec_isa_list
            if all(flag in flags for flag in str(isa).split())
        ]
    except Exception:  # another torch's internals: Inductor probes in turn, as before
        return
    if len(candidates) > 1:
        with ThreadPoolExecutor(len(candidates), thread_name_prefix="compileq-isa") as pool:
            list(pool.map(bool, candidates))


def fx_target(gpu: Target | None, cpu: bool = True) -> str:
    """Where a graph's code is generated: ``cpu-<isas>``, ``<gpu target>.cpu-<isas>``, or, for
    a GPU graph with no CPU tensor, ``<gpu target>`` alone.

    The CPU part is left out when no C++ is generated because finding the ISAs compiles a probe
    per ISA (tens of seconds on a GPU node): stock never pays that for a GPU graph, and a
    client that paid it on every graph took 80 s, not 24, for a GPT's first step.
    """
    if gpu is None:
        return f"cpu-{cpu_isas()}"
    return f"{gpu}.cpu-{cpu_isas()}" if cpu else str(gpu)


@dataclass(frozen=True)
class FxToolchain:
    """What must be equal for a worker to generate a graph's code as the client would."""

    torch_version: str
    torch_key: str
    compiler: str
    machine: str
    kernels: str  # the GPU Toolchain's digest for a GPU graph; empty for a CPU graph

    @functools.cached_property
    def digest(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:20]

    def describe(self) -> dict[str, Any]:
        return {**asdict(self), "digest": self.digest}


def local_fx_toolchain(gpu: Target | None) -> FxToolchain:
    import platform

    torch_version, tkey = torch_identity()
    return FxToolchain(
        torch_version=torch_version,
        torch_key=tkey,
        compiler=compiler_identity(),
        machine=platform.machine(),
        kernels="" if gpu is None else local_toolchain(gpu).digest,
    )


@functools.cache
def cpu_flags() -> str | None:
    """This CPU's feature flags as the kernel reports them (None where it does not)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return " ".join(sorted(set(line.split(":", 1)[1].split())))
    except OSError:
        pass
    return None


@functools.cache
def cpp_toolchain() -> str:
    """Digest of what decides the C++ object a command line builds here: the compiler,
    machine, torch, and this CPU's features, since Inductor compiles with ``-march=native``
    (torch 2.11 and 2.13 alike): the object may use any instruction this CPU has."""
    import platform

    material = {
        "compiler": compiler_identity(),
        "machine": platform.machine(),
        "torch": torch_identity(),
        "cpu_flags": cpu_flags(),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:20]


def host_identity() -> dict[str, Any]:
    """The target-free part of this machine's toolchain, recorded next to graph entries.

    Graphs (FX, AOTAutograd) are keyed by Inductor's own hash; this is the context
    ``compileq explain`` can show for them. Triton may be missing on a CPU-only client.
    """
    torch_version, tkey = torch_identity()
    identity: dict[str, Any] = {"torch_version": torch_version, "torch_key": tkey}
    try:
        identity["triton_version"], identity["triton_key"] = _triton_identity()
    except ImportError:
        identity["triton_version"] = identity["triton_key"] = None
    identity["codegen_env"] = dict(codegen_env())
    return identity
