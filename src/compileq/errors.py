"""Every exception compileq raises derives from :class:`CompileqError`."""

from __future__ import annotations


class CompileqError(Exception):
    """Root of compileq's exceptions."""


class ConfigError(CompileqError):
    """A setting is missing or invalid (for example no ``COMPILEQ_SECRET``)."""


class ManifestError(CompileqError):
    """A kernel manifest (JSONL) line is malformed."""


class CacheError(CompileqError):
    """The artifact store could not complete an operation."""


class IntegrityError(CacheError):
    """A stored entry failed authentication or decoding; it is never unpickled."""


class ForeignSecret(IntegrityError):
    """An entry or job sealed with another ``COMPILEQ_SECRET``: authentic for someone else, so
    it is never deleted (a node with a wrong secret must not wipe the cluster's cache)."""


class EntryTooLarge(CacheError):
    """An artifact is larger than ``COMPILEQ_MAX_ENTRY_BYTES``."""

    def __init__(self, key: str, size: int, limit: int) -> None:
        super().__init__(
            f"artifact {key} is {size} bytes, over the cap of {limit} bytes "
            f"(raise COMPILEQ_MAX_ENTRY_BYTES to store it)"
        )
        self.key, self.size, self.limit = key, size, limit


class UnsupportedTarget(CompileqError):
    """A kernel's target or a ``--arch`` value is not one compileq can route."""


class ToolchainMismatch(CompileqError):
    """A worker was asked to build a key its own toolchain would not produce."""


class WorkerError(CompileqError):
    """A worker process could not start (no GPU found, bad flags)."""


class DemoError(CompileqError):
    """A phase of ``compileq demo`` failed (its training step exited with an error)."""


class UnsafeDirError(CompileqError):
    """A per-user directory under the temporary dir exists but is not this user's alone."""


class LocalClusterError(CompileqError):
    """The local cluster (``compileq/local/``) could not be started, found or stopped."""
