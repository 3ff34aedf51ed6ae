"""The state store: ordered key-value transactions modelled on FoundationDB.

Open a store by URL and run transactions on tuple keys::

    from millstream.state import open_store

    store = open_store("sqlite:///tmp/wc.db", prefix=("wordcount",))
    store.transact(lambda txn: txn.add(("counts", "word"), 1))

Backends: ``sqlite:///abs/path.db`` (embedded, the default) and ``fdb://`` /
``fdb:///path/to/fdb.cluster`` (FoundationDB). Both enforce FoundationDB's limits.
"""

from millstream.state.keys import (
    Key,
    add_int64s,
    decode_int64,
    decode_int64s,
    encode_int64,
    encode_int64s,
    pack,
    unpack,
)
from millstream.state.limits import DEFAULT_LIMITS, StoreLimits
from millstream.state.store import Store
from millstream.state.transaction import StoreTransaction
from millstream.state.url import ACCEPTED_FORMS, open_store, parse_store_url

__all__ = [
    "ACCEPTED_FORMS",
    "DEFAULT_LIMITS",
    "Key",
    "Store",
    "StoreLimits",
    "StoreTransaction",
    "add_int64s",
    "decode_int64",
    "decode_int64s",
    "encode_int64",
    "encode_int64s",
    "open_store",
    "pack",
    "parse_store_url",
    "unpack",
]
