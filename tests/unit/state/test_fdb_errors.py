"""FoundationDB's error codes map to millstream's store errors, and the binding matches the client.

The mapping is a pure function of the error code (:func:`store_error`), so it is checked
here without a cluster. Where ``libfdb_c`` loads, the same table is checked against the
binding's own predicates on real ``fdb.FDBError`` objects; without it that test is skipped
with the reason (``fdb.FDBError`` lives in ``fdb.impl``, which loads ``libfdb_c`` on import).
"""

from __future__ import annotations

import pytest
from millstream.exceptions import (
    CommitUnknownResultError,
    RetryableStoreError,
    StoreConflictError,
    StoreError,
    StoreUnavailableError,
    TransactionTooOldError,
)
from millstream.state.fdb_backend import (
    BINDING_REQUIREMENT,
    FDB_API_VERSION,
    MAYBE_COMMITTED,
    MAYBE_COMMITTED_AT_COMMIT,
    RETRYABLE_NOT_COMMITTED,
    explain_load_error,
    load_fdb,
    map_fdb_error,
    store_error,
)

COMMIT_UNKNOWN_RESULT, TRANSACTION_TIMED_OUT, CLUSTER_VERSION_CHANGED = 1021, 1031, 1039


@pytest.mark.parametrize(
    "code", [COMMIT_UNKNOWN_RESULT, TRANSACTION_TIMED_OUT, CLUSTER_VERSION_CHANGED]
)
def test_commit_errors_that_may_have_committed_are_unknown_results(code: int) -> None:
    error = store_error(code, "what the client says", "commit")
    assert isinstance(error, CommitUnknownResultError), error
    assert f"FoundationDB error {code}" in str(error)
    assert "idempotent" in str(error)


def test_the_same_codes_before_a_commit_are_not_unknown_results() -> None:
    # Nothing can have been applied before the commit: a plain transient error.
    assert type(store_error(CLUSTER_VERSION_CHANGED, "d", "get")) is RetryableStoreError
    timed_out = store_error(TRANSACTION_TIMED_OUT, "d", "get_range")
    assert isinstance(timed_out, StoreUnavailableError)
    assert "timeout_ms" in str(timed_out)


def test_conflicts_and_too_old_keep_their_classes() -> None:
    assert isinstance(store_error(1020, "d", "commit"), StoreConflictError)
    assert isinstance(store_error(1007, "d", "get"), TransactionTooOldError)
    assert isinstance(store_error(1007, "d", "commit"), TransactionTooOldError)
    for code in RETRYABLE_NOT_COMMITTED:
        error = store_error(code, "d", "commit")
        assert isinstance(error, RetryableStoreError), code
        assert not isinstance(error, CommitUnknownResultError), code
    assert type(store_error(1025, "transaction_cancelled", "get")) is StoreError


@pytest.mark.fdb
def test_mapping_agrees_with_the_binding_predicates_on_real_errors() -> None:
    try:
        fdb = load_fdb()
    except StoreUnavailableError as exc:
        pytest.skip(f"needs libfdb_c for real fdb.FDBError objects: {str(exc)[:160]}")
    codes = sorted({*MAYBE_COMMITTED_AT_COMMIT, *RETRYABLE_NOT_COMMITTED, 1025, 2101, 2102})
    for code in codes:
        exc = fdb.FDBError(code)
        mapped = map_fdb_error(fdb, exc, "commit")
        maybe = bool(fdb.predicates.is_maybe_committed(exc))
        assert maybe == (code in MAYBE_COMMITTED), code
        assert isinstance(mapped, CommitUnknownResultError) == (
            maybe or code == TRANSACTION_TIMED_OUT
        ), code
        if fdb.predicates.is_retryable_not_committed(exc):
            assert code in RETRYABLE_NOT_COMMITTED, code


def test_installed_binding_passes_the_header_version_millstream_selects() -> None:
    # The binding passes its header version to libfdb_c, which refuses one newer than it
    # serves: an 8.0 binding (800) does not load against a 7.3 client. The pinned 7.3
    # series passes 730, which every client from 7.3 on accepts.
    import fdb

    assert fdb.LATEST_API_VERSION == FDB_API_VERSION, (
        f"the installed foundationdb binding passes header version {fdb.LATEST_API_VERSION}; "
        f"install {BINDING_REQUIREMENT!r}"
    )


def test_a_binding_newer_than_the_client_names_both_versions_and_the_fix() -> None:
    text = (
        "This version of the FoundationDB Python binding is not supported by the installed "
        "FoundationDB C library. The binding requires a library that supports API version "
        "800, but the installed library supports a maximum version of 730."
    )
    message = explain_load_error(
        text, binding_version="8.0.0", header_version=800, max_supported=730
    )
    assert "foundationdb 8.0.0" in message
    assert "header version 800" in message
    assert "up to 730" in message
    assert f"pip install '{BINDING_REQUIREMENT}'" in message


def test_a_client_older_than_7_3_asks_for_a_newer_client() -> None:
    message = explain_load_error(
        "API version 730 is not supported by the installed FoundationDB C library.",
        binding_version="7.3.79",
        header_version=730,
        max_supported=710,
    )
    assert "up to 710" in message
    assert "7.3 or newer" in message


def test_a_missing_client_library_says_how_to_install_it() -> None:
    message = explain_load_error(
        "Unable to locate the FoundationDB API shared library!",
        binding_version="7.3.79",
        header_version=730,
        max_supported=None,
        missing=True,
    )
    assert message.startswith("FoundationDB client library libfdb_c not found")
    assert "foundationdb-clients" in message
