"""Targets, toolchains and the content key."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from torch._inductor import codecache

from compileq import fingerprint
from compileq.errors import UnsupportedTarget
from compileq.fingerprint import Target, codegen_env, local_toolchain
from compileq.tasks.jobs import TritonJob
from tests.conftest import FIXTURES, manifest_rows


def test_the_target_is_read_from_the_kernels_device_properties() -> None:
    row = manifest_rows(FIXTURES / "dynamic_mlp.jsonl")[0]
    assert Target.from_source(row["source"]) == Target("cuda", "90", 32)
    assert Target.from_source("def f(): pass") is None


@pytest.mark.parametrize("text", ["sm_90", "sm90", "sm_90a", "cuda-90-w32"])
def test_arch_flags_name_cuda_targets(text: str) -> None:
    assert str(Target.parse(text)) == "cuda-90-w32"


@pytest.mark.parametrize("text", ["", "hopper", "sm_", "cuda-90"])
def test_an_unknown_arch_is_refused_with_a_hint(text: str) -> None:
    with pytest.raises(UnsupportedTarget, match="sm_<cc>"):
        Target.parse(text)


def test_the_key_changes_with_every_component() -> None:
    row = manifest_rows(FIXTURES / "dynamic_mlp.jsonl")[0]
    job = TritonJob(row["name"], row["source"], {"use_static_triton_launcher": True})
    target = Target("cuda", "90", 32)
    toolchain = local_toolchain(target)
    base = job.key(toolchain, target)
    variants = [
        dataclasses.replace(job, source=job.source + "\n").key(toolchain, target),
        dataclasses.replace(job, extra_config={"use_static_triton_launcher": False}).key(
            toolchain, target
        ),
        job.key(dataclasses.replace(toolchain, triton_version="0.0"), target),
        job.key(dataclasses.replace(toolchain, assembler="ptxas 1.0"), target),
        job.key(
            dataclasses.replace(toolchain, codegen_env=(("TRITON_F32_DEFAULT", "ieee"),)), target
        ),
        job.key(toolchain, Target("cuda", "80", 32)),
    ]
    assert base.startswith("compileq:a:triton:")
    assert len({base, *variants}) == len(variants) + 1
    assert job.key(toolchain, target) == base  # and it is deterministic


def test_codegen_env_keeps_codegen_variables_and_drops_locations() -> None:
    env = {
        "TRITON_CACHE_DIR": "/x",
        "TRITON_DEFAULT_FP_FUSION": "0",
        "PATH": "/bin",
        "TRITON_HOME": "/h",
    }
    assert codegen_env(env) == (("TRITON_DEFAULT_FP_FUSION", "0"),)


def test_the_toolchain_memo_is_recomputed_when_a_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text("x = 1\n")
    calls: list[int] = []

    def compute() -> str:
        calls.append(1)
        return f"value-{len(calls)}"

    sig = fingerprint._stat_signature(str(pkg), (".py",))
    assert fingerprint._memoised("k", sig, compute) == "value-1"
    assert fingerprint._memoised("k", sig, compute) == "value-1"
    (pkg / "a.py").write_text("x = 22\n")
    sig2 = fingerprint._stat_signature(str(pkg), (".py",))
    assert sig2 != sig
    assert fingerprint._memoised("k", sig2, compute) == "value-2"
    assert (
        json.loads((tmp_path / "cache" / "compileq" / "toolchain.json").read_text())["k"]["value"]
        == "value-2"
    )


def test_a_kernel_inductor_renumbered_keeps_its_key_and_its_body_does_not() -> None:
    row = manifest_rows(FIXTURES / "dynamic_mlp.jsonl")[0]
    job = TritonJob(row["name"], row["source"], {"use_static_triton_launcher": True})
    target = Target("cuda", "90", 32)
    toolchain = local_toolchain(target)
    # An edit earlier in the model shifts Inductor's counter: same kernel, another name.
    renamed = row["name"].rsplit("_", 1)[0] + "_99"
    moved = TritonJob(renamed, row["source"].replace(row["name"], renamed), job.extra_config)
    assert moved.key(toolchain, target) == job.key(toolchain, target)
    body = row["source"].replace("xoffset = ", "xoffset = 1 + ", 1)
    assert TritonJob(row["name"], body, job.extra_config).key(toolchain, target) != job.key(
        toolchain, target
    )


#: Run in a fresh process: seed Inductor's keys from the memo (or not), then ask Inductor.
_INDUCTOR_KEYS = """
import json, sys
from compileq import fingerprint
seeded = fingerprint.seed_inductor_keys() if sys.argv[1] == "seed" else []
from torch._inductor import codecache
from torch._inductor.runtime import triton_compat
triton_key = getattr(codecache, "triton_key", triton_compat.triton_key)  # 2.13, 2.11
print(json.dumps({"seeded": seeded, "torch_key": codecache.torch_key().hex(),
                  "triton_key": triton_key()}))
"""
#: Both keys, on every torch: 2.13 keeps them in caches with ``set()``; on 2.11 Triton's key
#: is seeded where Inductor looks it up (``triton_compat``). And Triton's key where Triton's
#: own compiler reads it.
SEEDABLE = ["torch_key", "triton_key", "triton_compiler_key"]


def inductor_keys(xdg: Path, how: str) -> dict[str, object]:
    import os
    import subprocess
    import sys

    env = {**os.environ, "XDG_CACHE_HOME": str(xdg)}
    out = subprocess.run(
        [sys.executable, "-c", _INDUCTOR_KEYS, how], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]


def test_inductors_keys_are_seeded_from_the_memo_with_the_values_inductor_computes(
    tmp_path: Path,
) -> None:
    if not hasattr(codecache.torch_key, "set"):
        pytest.skip("this torch keeps torch_key in a cache without set()")
    hashed = inductor_keys(tmp_path, "hash")  # Inductor hashing the files itself
    first = inductor_keys(tmp_path, "seed")  # no memo yet: computed (by Inductor), memoised
    second = inductor_keys(tmp_path, "seed")  # a later process: from the memo
    # No memo yet: computed. torch 2.13's caches then refuse a value (nothing seeded); on
    # 2.11 triton_compat is pointed at the value Triton just computed, which changes nothing.
    assert "torch_key" not in first["seeded"]
    assert second["seeded"] == SEEDABLE
    for got in (first, second):
        assert (got["torch_key"], got["triton_key"]) == (hashed["torch_key"], hashed["triton_key"])


def test_a_seeded_key_is_what_inductor_uses_and_a_stale_memo_is_not(tmp_path: Path) -> None:
    if not hasattr(codecache.torch_key, "set"):
        pytest.skip("this torch keeps torch_key in a cache without set()")
    inductor_keys(tmp_path, "seed")  # memoised
    memo_path = tmp_path / "compileq" / "toolchain.json"
    memo = json.loads(memo_path.read_text())
    real = memo["torch_key"]["value"]
    memo["torch_key"]["value"] = "ab" * 32  # Inductor hashes nothing once seeded: it says this
    memo_path.write_text(json.dumps(memo))
    assert inductor_keys(tmp_path, "seed")["torch_key"] == "ab" * 32
    memo["torch_key"] = {"signature": "a file of torch changed", "value": "ab" * 32}
    memo_path.write_text(json.dumps(memo))
    assert inductor_keys(tmp_path, "seed")["torch_key"] == real


_SYSTEM_INFO = """
import json
from compileq import fingerprint
seeded = fingerprint.seed_inductor_keys()
from torch._inductor import codecache
from torch._inductor.runtime import triton_compat
from triton.runtime import cache
system = codecache.CacheBase.get_system()  # in every FX-graph and AOTAutograd cache key
real = getattr(cache.triton_key, "__wrapped__", cache.triton_key)  # Triton's own lru_cache
print(json.dumps({"seeded": seeded, "triton_hashed": real.cache_info().misses,
                  "compat": triton_compat.triton_key(), "system": system}))
"""

_TRITON_COMPAT = """
import json
from compileq import fingerprint
from torch._inductor.runtime import triton_compat
from triton.runtime import cache
fingerprint._seed_triton_compat(fingerprint._triton_key())
value, hashed = triton_compat.triton_key(), cache.triton_key.cache_info().misses
try:
    fingerprint._seed_triton_compat("again")
    again = "seeded twice"
except RuntimeError:
    again = "refused"
print(json.dumps({"value": value, "hashed": hashed, "again": again, "real": cache.triton_key()}))
"""


def test_inductors_system_info_is_computed_without_triton_hashing_its_files(
    tmp_path: Path,
) -> None:
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}

    def fresh_process(script: str) -> dict[str, object]:
        out = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]

    first, second = fresh_process(_SYSTEM_INFO), fresh_process(_SYSTEM_INFO)  # 1st: the memo
    assert "triton_key" in second["seeded"]
    assert second["triton_hashed"] == 0  # Triton's own triton_key() never ran
    assert second["compat"] == first["compat"]  # the value Triton computed, for torch 2.11
    assert second["system"] == first["system"]
    # torch 2.11's way, taken on any torch: the memo's value where Inductor looks Triton's up.
    compat = fresh_process(_TRITON_COMPAT)
    assert compat["hashed"] == 0 and compat["again"] == "refused"
    assert compat["value"] == compat["real"] == first["compat"]


_TRITON_COMPILE = """
import json
from compileq import fingerprint
from compileq.build.triton import enable_cross_compile
seeded = fingerprint.seed_inductor_keys()
enable_cross_compile()  # no GPU here: the target is given
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime import cache

@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

signature = {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
src = ASTSource(add_one, signature=signature, constexprs={"BLOCK": 128})
kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32))
real = getattr(cache.triton_key, "__wrapped__", cache.triton_key)  # Triton's own lru_cache
hashed = real.cache_info().misses
print(json.dumps({"seeded": seeded, "hashed": hashed, "cubin": len(kernel.asm["cubin"]),
                  "key": cache.triton_key(), "real": real()}))
"""


def test_a_kernel_tritons_compiler_builds_is_keyed_on_the_memo_without_hashing_tritons_files(
    tmp_path: Path,
) -> None:
    # A warm graph's load can compile a kernel in the client (_dynamic_scale_rblock): on a
    # new machine its first triton.compile hashed Triton's files, 0.38 s (H200, GoogleFnet).
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    script = tmp_path / "compile_one.py"  # a file: Triton's jit reads the kernel's source
    script.write_text(_TRITON_COMPILE)

    def fresh_process() -> dict[str, object]:
        # Each on an empty Triton cache dir: a compile, not a hit in Triton's file cache.
        cache_dir = tmp_path / f"triton-{len(list(tmp_path.glob('triton-*')))}"
        out = subprocess.run(
            [sys.executable, str(script)],
            env={**env, "TRITON_CACHE_DIR": str(cache_dir)},
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.splitlines()[-1])  # type: ignore[no-any-return]

    first, second = fresh_process(), fresh_process()  # the first fills the memo
    assert first["hashed"] == 1  # computed once, by Triton, for the memo
    assert "triton_compiler_key" in second["seeded"] and second["hashed"] == 0
    assert second["cubin"] == first["cubin"] > 0  # a real build, keyed on the memo's value
    assert second["key"] == first["real"]  # the value Triton computes, where it computed
