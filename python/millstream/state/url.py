"""Store URLs: which backend, where, and with which options."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from millstream.exceptions import ConfigurationError
from millstream.state.keys import Key
from millstream.state.limits import StoreLimits
from millstream.state.store import Store

ACCEPTED_FORMS = (
    "sqlite:///absolute/path/to/file.db[?busy_timeout_ms=10000&synchronous=full|normal"
    "&checkpoint_pages=16384&run_min_keys=256&secure_delete=fast|on|off]",
    "fdb:// (the default cluster file)",
    "fdb:///path/to/fdb.cluster[?timeout_ms=10000]",
)

_SQLITE_OPTIONS = {
    "busy_timeout_ms",
    "synchronous",
    "checkpoint_pages",
    "run_min_keys",
    "secure_delete",
}
_FDB_OPTIONS = {"timeout_ms"}


@dataclass(frozen=True)
class StoreURL:
    """A parsed store URL.

    Attributes:
        scheme: ``"sqlite"`` or ``"fdb"``.
        path: The SQLite file, or the FoundationDB cluster file (``None``: the default).
        options: Query options, validated per scheme.
    """

    scheme: str
    path: str | None
    options: dict[str, str] = field(default_factory=dict)


def _bad(url: str, why: str) -> ConfigurationError:
    forms = "\n  ".join(ACCEPTED_FORMS)
    return ConfigurationError(f"bad store URL {url!r}: {why}. Accepted forms:\n  {forms}")


def parse_store_url(url: str) -> StoreURL:
    """Parse and validate a store URL.

    Raises:
        ConfigurationError: The URL is not one of :data:`ACCEPTED_FORMS`.
    """
    if not isinstance(url, str) or "://" not in url:
        raise _bad(str(url), "expected scheme://...")
    parts = urlsplit(url)
    options = dict(parse_qsl(parts.query, keep_blank_values=True))
    path = unquote(parts.path)
    if parts.scheme == "sqlite":
        if parts.netloc:
            raise _bad(
                url, f"the path must be absolute: sqlite:///{parts.netloc}{path} (three slashes)"
            )
        if not path or path == "/" or not os.path.isabs(path):
            raise _bad(url, "the SQLite URL needs an absolute file path")
        unknown = set(options) - _SQLITE_OPTIONS
        if unknown:
            raise _bad(url, f"unknown option(s) {sorted(unknown)}")
        return StoreURL("sqlite", path, options)
    if parts.scheme in ("fdb", "foundationdb"):
        if parts.netloc:
            raise _bad(url, "write the cluster file as an absolute path: fdb:///path/fdb.cluster")
        unknown = set(options) - _FDB_OPTIONS
        if unknown:
            raise _bad(url, f"unknown option(s) {sorted(unknown)}")
        return StoreURL("fdb", path if path and path != "/" else None, options)
    raise _bad(url, f"unknown scheme {parts.scheme!r}")


def _int_option(url: str, options: dict[str, str], name: str, default: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise _bad(url, f"{name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise _bad(url, f"{name} must be >= 0, got {value}")
    return value


def open_store(url: str, prefix: Key = (), limits: StoreLimits | None = None) -> Store:
    """Open the store at ``url`` with every key under ``prefix``.

    Args:
        url: ``sqlite:///abs/path/file.db`` (the embedded default; created if missing),
            ``fdb://`` (FoundationDB, default cluster file) or
            ``fdb:///path/to/fdb.cluster``.
        prefix: Tuple all keys of this store object live under, e.g. ``("wordcount",)``.
        limits: StoreTransaction limits; FoundationDB's by default (lower them in tests).

    Raises:
        ConfigurationError: The URL is malformed.
        StoreUnavailableError: The store cannot be opened or reached, or libfdb_c is missing.
        StoreCorruptError: The SQLite file is damaged or not a millstream store.
    """
    parsed = parse_store_url(url)
    if parsed.scheme == "sqlite":
        from millstream.state.sqlite import (
            DEFAULT_BUSY_TIMEOUT_MS,
            DEFAULT_CHECKPOINT_PAGES,
            SECURE_DELETE,
            SqliteStore,
        )
        from millstream.state.sqlite.runs import DEFAULT_RUN_MIN_KEYS

        assert parsed.path is not None
        sync = parsed.options.get("synchronous", "full").upper()
        if sync not in ("FULL", "NORMAL"):
            raise _bad(url, f"synchronous must be full or normal, got {sync.lower()!r}")
        secure_delete = parsed.options.get("secure_delete", SECURE_DELETE[0]).upper()
        if secure_delete not in SECURE_DELETE:
            raise _bad(url, f"secure_delete must be fast, on or off, got {secure_delete.lower()!r}")
        return SqliteStore(
            url,
            parsed.path,
            prefix,
            limits,
            busy_timeout_ms=_int_option(
                url, parsed.options, "busy_timeout_ms", DEFAULT_BUSY_TIMEOUT_MS
            ),
            synchronous=sync,
            checkpoint_pages=_int_option(
                url, parsed.options, "checkpoint_pages", DEFAULT_CHECKPOINT_PAGES
            ),
            run_min_keys=_int_option(url, parsed.options, "run_min_keys", DEFAULT_RUN_MIN_KEYS),
            secure_delete=secure_delete,
        )
    from millstream.state.fdb_backend import DEFAULT_TIMEOUT_MS, FdbStore

    return FdbStore(
        url,
        parsed.path,
        prefix,
        limits,
        timeout_ms=_int_option(url, parsed.options, "timeout_ms", DEFAULT_TIMEOUT_MS),
    )


__all__ = ["ACCEPTED_FORMS", "StoreURL", "open_store", "parse_store_url"]
