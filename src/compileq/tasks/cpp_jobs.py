"""A C++ build job: Inductor's compiler command lines for one object, and the files they read.

Inductor builds a C++ kernel by running its compiler (``CppBuilder.get_command_line``) on
files in its cache dir, with include and library dirs of this machine's torch and Python. A
worker with the same compiler, torch and CPU (``fingerprint.cpp_toolchain``, the queue) runs
the same command lines, with each machine-specific path written here as a placeholder and
filled in there with its own:

* ``{cxx}``: the compiler, as the first word;
* ``{in}/<n>_<name>``: a source this side read (sent with the job, as text);
* ``{out}/<name>``: what a command writes (the object, and any object a later one links);
* ``{pch}/<name>.h``: Inductor's precompiled header, sent with the command line that
  precompiles it (``Header``), which a worker runs once and keeps;
* ``{torch}``, ``{py_include}``, ``{py_libdir}``: torch's package dir and Python's include
  and library dirs (``machine_dirs``).

A command line naming any other path is not sent (the client builds it, as stock): the
worker must never read or write outside its own dirs. The job's key is the object's artifact
key as the client computes it (``scheduler.cpp_cache.cpp_key``): a worker cannot recompute it
(Inductor's hash covers the client's paths), so, as for an FX job, the signature vouches that
key and job belong together.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compileq.errors import CompileqError

KIND = "cpp"
FORMAT = 1
CXX, IN, OUT, PCH = "{cxx}", "{in}", "{out}", "{pch}"
DIRS = ("{torch}", "{py_include}", "{py_libdir}")
#: Files a command reads that travel with the job; anything else named by path does not.
_SENT = (".cpp", ".cc", ".c", ".h", ".hpp")
#: A file name as it may appear after ``{in}/``, ``{out}/`` or ``{pch}/``.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,200}")
_PLACEHOLDER = re.compile(r"\{[a-z_]+\}")
#: A placeholder and the path under it (up to a separator an option may put after it).
_UNDER_PLACEHOLDER = re.compile(r"\{[a-z_]+\}(/[^\s,:;=]*)?")
#: Total text a job may carry: a kernel's sources are tens of kilobytes.
_MAX_FILES_BYTES = 8 * 1024 * 1024


class Unportable(CompileqError):
    """A command line names a path no placeholder stands for: it is built where it is."""


def machine_dirs() -> dict[str, str]:
    """This machine's values of the directory placeholders."""
    import torch

    paths = sysconfig.get_paths()
    dirs = {
        "{torch}": os.path.dirname(os.path.abspath(torch.__file__)),
        "{py_include}": paths.get("include") or "",
        "{py_libdir}": str(sysconfig.get_config_var("LIBDIR") or ""),
    }
    return {name: path for name, path in dirs.items() if path and path != "/"}


@dataclass(frozen=True)
class Header:
    """Inductor's precompiled header: ``{pch}/<name>``, its text, and the command line that
    precompiles it into ``{pch}/<name>.gch`` (gcc reads that in place of the text, and
    ignores it unless it was made with the same options)."""

    name: str
    text: str
    step: tuple[str, ...]


@dataclass(frozen=True)
class CppJob:
    toolchain: str  # fingerprint.cpp_toolchain() of the client
    steps: tuple[tuple[str, ...], ...]  # each a command line, placeholders unfilled
    output: str  # "{out}/<name>": the object the key names
    files: dict[str, str]  # "{in}/<n>_<name>" -> its text
    header: Header | None = None

    @classmethod
    def from_builders(
        cls,
        toolchain: str,
        builders: Sequence[Any],
        dirs: Mapping[str, str],
        headers: Mapping[str, Any] | None = None,
    ) -> CppJob:
        """The job for Inductor's ``CppBuilder`` list (built in order, the last one the
        object). ``headers``: each precompiled header's path -> the builder that precompiles
        it. Raises ``Unportable`` where a command line cannot travel."""
        named = {
            str(b.get_target_file_path()): f"{OUT}/{os.path.basename(b.get_target_file_path())}"
            for b in builders
        }
        headers = headers or {}
        named.update({path: f"{PCH}/{os.path.basename(path)}" for path in headers})
        files: dict[str, str] = {}
        steps = tuple(_portable_line(b, named, files, dirs) for b in builders)
        used = [p for p in headers if named[p] in {w for step in steps for w in step}]
        header = None
        if used:
            path, builder = used[0], headers[used[0]]
            gch = {str(builder.get_target_file_path()): named[path] + ".gch", path: named[path]}
            with open(path, encoding="utf-8") as f:
                text = f.read()
            step = _portable_line(builder, gch, {}, dirs)
            header = Header(os.path.basename(path), text, step)
        output = named[str(builders[-1].get_target_file_path())]
        job = cls(toolchain, steps, output, files, header)
        job.check()
        return job

    def check(self) -> None:
        """Raise ValueError unless every placeholder is known and every name is a plain
        file name: what a worker fills in must stay inside its own dirs."""
        lines = [*self.steps, *([self.header.step] if self.header else [])]
        if not self.steps or not all(line and line[0] == CXX for line in lines):
            raise ValueError("C++ job: every step must start with {cxx}")
        known = {IN, OUT, *DIRS, *([PCH] if self.header else [])}
        for word in (w for line in lines for w in line[1:]):
            if any(p not in known for p in _PLACEHOLDER.findall(word)):
                raise ValueError(f"C++ job: unknown placeholder in {word!r}")
            if "/" in _UNDER_PLACEHOLDER.sub("", word) or "/.." in word:
                raise ValueError(f"C++ job: a path outside the worker's dirs in {word!r}")
            for prefix in (IN, OUT, PCH):
                for name in word.split(prefix + "/")[1:]:
                    if not _NAME.fullmatch(name):
                        raise ValueError(f"C++ job: bad file name in {word!r}")
        if not self.output.startswith(OUT + "/") or not _NAME.fullmatch(self.output[6:]):
            raise ValueError("C++ job: the output must be {out}/<name>")
        for name in self.files:
            if not name.startswith(IN + "/") or not _NAME.fullmatch(name[5:]):
                raise ValueError(f"C++ job: bad file name {name!r}")
        if self.header is not None and not (
            _NAME.fullmatch(self.header.name) and self.header.name.endswith(".h")
        ):
            raise ValueError("C++ job: bad header name")
        text = sum(len(t) for t in self.files.values()) + len(
            self.header.text if self.header else ""
        )
        if text > _MAX_FILES_BYTES:
            raise ValueError("C++ job: its files are over the cap")

    def to_bytes(self) -> bytes:
        header = self.header
        return json.dumps(
            {
                "format": FORMAT,
                "toolchain": self.toolchain,
                "steps": [list(step) for step in self.steps],
                "output": self.output,
                "files": self.files,
                "header": None
                if header is None
                else {"name": header.name, "text": header.text, "step": list(header.step)},
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> CppJob:
        obj = json.loads(data)
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise ValueError("C++ job: not an object of this format")
        steps, files, header = obj.get("steps"), obj.get("files"), obj.get("header")
        if not (
            isinstance(obj.get("toolchain"), str)
            and isinstance(obj.get("output"), str)
            and isinstance(steps, list)
            and all(_words(s) for s in steps)
            and isinstance(files, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
            and (
                header is None
                or (
                    isinstance(header, dict)
                    and isinstance(header.get("name"), str)
                    and isinstance(header.get("text"), str)
                    and _words(header.get("step"))
                )
            )
        ):
            raise ValueError("C++ job: malformed fields")
        job = cls(
            obj["toolchain"],
            tuple(tuple(s) for s in steps),
            obj["output"],
            dict(files),
            None
            if header is None
            else Header(header["name"], header["text"], tuple(header["step"])),
        )
        job.check()
        return job


def _words(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(w, str) for w in value)


def _portable_line(
    builder: Any, named: Mapping[str, str], files: dict[str, str], dirs: Mapping[str, str]
) -> tuple[str, ...]:
    words = shlex.split(builder.get_command_line())
    if not words:
        raise Unportable("an empty command line")
    return (CXX, *(_portable(w, named, files, dirs) for w in words[1:]))


def _portable(
    word: str, named: Mapping[str, str], files: dict[str, str], dirs: Mapping[str, str]
) -> str:
    if word in named:
        return named[word]
    if os.path.isabs(word) and word.endswith(_SENT) and os.path.isfile(word):
        name = f"{IN}/{len(files)}_{os.path.basename(word)}"
        with open(word, encoding="utf-8") as f:
            files[name] = f.read()
        return name
    # Longest first: a venv's torch dir may sit under Python's prefix.
    for placeholder, path in sorted(dirs.items(), key=lambda item: -len(item[1])):
        word = word.replace(path, placeholder)
    if "/" in _UNDER_PLACEHOLDER.sub("", word):
        raise Unportable(f"a path no worker has: {word!r}")
    return word


def fill(word: str, values: Mapping[str, str]) -> str:
    """``word`` with each placeholder replaced by this machine's value (``values``)."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(0)], word)
