"""The C allocator's settings for worker processes, whichever runner starts them.

Only the standard library (nothing at all) is imported here: the local runner's fork
server reads it before millstream's heavy modules are imported.
"""

MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(128 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}
"""Large GetRows payloads are allocated and freed in bulk; these keep glibc from handing that
memory back to the kernel after every call (measured: 8x slower get_rows with the defaults)."""

__all__ = ["MALLOC_ENV"]
