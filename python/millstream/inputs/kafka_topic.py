"""A Kafka topic as an input: each topic partition is an input partition.

Exactly once needs nothing from Kafka but replay from an offset. The mapper's continuation
token is the partition's **next offset to read** (not a row count: with transactions, the
offsets of committed records have gaps where control records and aborted records sit), and
it is persisted with the mapper's state, which moves only once the reducers have committed
every row before it (thesis 4.3.5). A restarted mapper reads from that offset again; the
rows of input numbering after it are the committed records after it, the same ones every
time. Records are read with ``isolation.level=read_committed`` always, so records of
aborted or open transactions never reach a mapper.

The consumer group's committed offsets are only a mirror, written after each persist for
lag tools (when ``group_id`` is set); they are never read back.

Records are fetched by the Rust core's reader (``millstream._core.KafkaPartitionReader``:
Kafka's Fetch spoken directly, record batches decoded into Arrow columns without a Python
step per record) when the connection is plain; with TLS or SASL in ``config``, by
confluent-kafka. Metadata, end offsets and the group mirror go through confluent-kafka
either way.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from millstream._core import KafkaOffsetOutOfRangeError, KafkaReadError
from millstream.exceptions import ConfigurationError, InputError, MillstreamError
from millstream.inputs.base import ReadResult
from millstream.inputs.kafka_core_reader import CoreReader, CoreReaderSettings
from millstream.inputs.kafka_decoders import RawBytes, ValueDecodeError, ValueDecoder

if TYPE_CHECKING:
    import confluent_kafka

log = logging.getLogger(__name__)

FETCH_MESSAGES = 20_000
"""Records taken from the consumer's queue per call (it prefetches in the background)."""

FETCH_WAIT_SECONDS = 0.1
"""How long a read waits for its first record when none is queued."""

CONSUMER_DEFAULTS: Mapping[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "error",
    "max.partition.fetch.bytes": 8 * 1024 * 1024,
    "fetch.max.bytes": 64 * 1024 * 1024,
    "queued.min.messages": 200_000,
    "queued.max.messages.kbytes": 64 * 1024,
}
"""Settings every reader's consumer gets (``KafkaTopic.config`` cannot change them, except
the fetch sizes)."""

FIXED_SETTINGS = (
    "isolation.level",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "enable.partition.eof",
    "auto.offset.reset",
    "group.id",
)
"""Settings the reader needs as it sets them."""

_TOKEN = struct.Struct("<q")


def _plain(config: Mapping[str, Any]) -> bool:
    """Whether consumers with ``config`` connect without TLS or SASL."""
    protocol = str(config.get("security.protocol", "plaintext")).lower()
    secured = any(str(k).startswith(("ssl.", "sasl.")) for k in config)
    return protocol == "plaintext" and not secured


def _encode_token(offset: int) -> bytes:
    return _TOKEN.pack(offset)


def _decode_token(token: bytes) -> int:
    try:
        (offset,) = _TOKEN.unpack(token)
    except struct.error as exc:
        raise InputError(f"bad KafkaTopic continuation token {token!r}") from exc
    return int(offset)


def _kafka() -> Any:
    try:
        import confluent_kafka
    except ImportError as exc:
        raise ConfigurationError(
            "KafkaTopic needs confluent-kafka: pip install 'millstream[kafka]'"
        ) from exc
    return confluent_kafka


HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

COLUMNS = ("key", "value", "timestamp", "headers", "partition", "offset")
"""The columns of a record, in the order batches have them."""


@dataclass(frozen=True)
class KafkaTopic:
    """A Kafka topic as a processor input: partition ``p`` of the topic is input partition
    ``p``, read with ``read_committed`` isolation, exactly once.

    The topic's partition count is read when the object is built, and fixed: a processor's
    partition count never changes, so partitions added to the topic later are refused
    with an error (start a new processor to read them).

    Each row is one record, with columns ``key`` (binary), ``value`` (what the decoder
    makes of it), ``timestamp`` (ms, UTC), ``headers`` (list of key/value structs),
    ``partition`` and ``offset``.

    Args:
        bootstrap_servers: The brokers (``host:port,...``).
        topic: The topic.
        value: How values are decoded: :class:`~millstream.inputs.RawBytes` (the default),
            :class:`~millstream.inputs.Json` or :class:`~millstream.inputs.Avro`, or any
            :class:`~millstream.inputs.ValueDecoder`.
        bounded: Stop at the partitions' end offsets as they are when this object is built
            (backfills, tests); by default the input never ends.
        start_offsets: The offset each partition is read from (default 0: every record).
            Records below a partition's log start were deleted by retention: starting
            there is refused, as is resuming below it; name the offsets to start later.
        group_id: Mirror the read position into this consumer group's committed offsets
            after each persist, so that Kafka's lag tools see the processor. Never read
            back (the processor's own state is the position).
        config: More librdkafka settings for the consumers (security, client id, fetch
            sizes, ``queued.max.messages.kbytes``: how much a partition's reader fetches
            ahead of the mapper, 64 MiB by default); ``isolation.level`` and the offset
            handling cannot be changed.
        timeout_seconds: How long metadata and offset queries may take.
        columns: Read only these of the record's columns (in this order; the mapper sees
            nothing else). With confluent-kafka each column costs a call per record to
            build, so naming only the columns the mapper reads makes reading faster there;
            the rows are the same records either way.
        native_reader: Fetch records with the Rust core's reader (Kafka's Fetch spoken
            directly, batches decoded without Python per record: several times faster)
            rather than confluent-kafka. By default it is used when the connection is
            plain (no ``security.protocol`` but ``plaintext``, no ``ssl.*`` or ``sasl.*``
            setting); with TLS or SASL, confluent-kafka reads. Both give the same rows.
    """

    bootstrap_servers: str
    topic: str
    value: ValueDecoder = field(default_factory=RawBytes)
    bounded: bool = False
    start_offsets: Mapping[int, int] | None = None
    group_id: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    timeout_seconds: float = 10.0
    columns: tuple[str, ...] | None = None
    native_reader: bool | None = None
    partition_count: int = field(init=False, default=0)
    """The topic's partitions when this object was built."""
    end_offsets: tuple[int, ...] | None = field(init=False, default=None)
    """Bounded: each partition's end offset when this object was built."""

    def __post_init__(self) -> None:
        if not isinstance(self.value, ValueDecoder):
            raise ConfigurationError(
                f"value must be a decoder (RawBytes(), Json(schema), Avro(schema) or an object "
                f"with value_type and decode), got {self.value!r}"
            )
        fixed = sorted(set(self.config) & set(FIXED_SETTINGS))
        if fixed:
            raise ConfigurationError(
                f"KafkaTopic config may not set {fixed}: records are read read_committed "
                "from the offsets the processor persists (set group_id to name the group)"
            )
        if self.columns is not None:
            unknown = [c for c in self.columns if c not in COLUMNS]
            if unknown or not self.columns or len(set(self.columns)) != len(self.columns):
                raise ConfigurationError(
                    f"KafkaTopic columns must name some of {list(COLUMNS)}, each once; "
                    f"got {list(self.columns)}"
                )
            object.__setattr__(self, "columns", tuple(self.columns))
        object.__setattr__(self, "start_offsets", dict(self.start_offsets or {}))
        object.__setattr__(self, "config", dict(self.config))
        if self.native_reader and not _plain(self.config):
            raise ConfigurationError(
                "KafkaTopic native_reader=True reads over plain connections only; the config "
                "sets TLS or SASL (leave native_reader unset to read with confluent-kafka)"
            )
        if self.native_reader is None:
            object.__setattr__(self, "native_reader", _plain(self.config))
        consumer = self.consumer()
        try:
            count = self._current_partition_count(consumer)
            object.__setattr__(self, "partition_count", count)
            bad = [p for p in (self.start_offsets or {}) if not 0 <= p < count]
            if bad:
                raise ConfigurationError(
                    f"start_offsets names partitions {bad} but topic {self.topic!r} has "
                    f"partitions 0-{count - 1}"
                )
            if self.bounded:
                ends = tuple(self._watermarks(consumer, p)[1] for p in range(count))
                object.__setattr__(self, "end_offsets", ends)
        finally:
            consumer.close()

    # -- the Input protocol --------------------------------------------------------------

    @property
    def num_partitions(self) -> int:
        """The topic's partitions (fixed when this object was built)."""
        return self.partition_count

    def reader(self, partition: int) -> KafkaPartitionReader:
        """A reader of topic partition ``partition``."""
        if not 0 <= partition < self.partition_count:
            raise ConfigurationError(
                f"partition {partition} out of range: topic {self.topic!r} has "
                f"{self.partition_count} partitions"
            )
        return KafkaPartitionReader(self, partition)

    def start_offset(self, partition: int) -> int:
        """Where partition ``partition`` is read from when the processor has read nothing."""
        return int((self.start_offsets or {}).get(partition, 0))

    @property
    def schema(self) -> pa.Schema:
        """The schema of the batches mappers read (the :attr:`columns` read)."""
        types = {
            "key": pa.binary(),
            "value": self.value.value_type,
            "timestamp": pa.timestamp("ms", tz="UTC"),
            "headers": HEADERS_TYPE,
            "partition": pa.int32(),
            "offset": pa.int64(),
        }
        return pa.schema([(name, types[name]) for name in self.columns or COLUMNS])

    # -- talking to the brokers ------------------------------------------------------------

    def consumer(self) -> confluent_kafka.Consumer:
        """A new consumer with the reader's settings (assigned nothing)."""
        kafka = _kafka()
        settings = {
            **CONSUMER_DEFAULTS,
            **self.config,
            "bootstrap.servers": self.bootstrap_servers,
            "isolation.level": "read_committed",
            "group.id": self.group_id or "millstream",
        }
        try:
            consumer: confluent_kafka.Consumer = kafka.Consumer(settings)
        except kafka.KafkaException as exc:
            raise ConfigurationError(f"cannot create a Kafka consumer: {exc}") from exc
        return consumer

    def _current_partition_count(self, consumer: confluent_kafka.Consumer) -> int:
        kafka = _kafka()
        try:
            metadata = consumer.list_topics(self.topic, timeout=self.timeout_seconds)
        except kafka.KafkaException as exc:
            raise ConfigurationError(
                f"cannot read the metadata of topic {self.topic!r} from "
                f"{self.bootstrap_servers}: {exc}"
            ) from exc
        found = metadata.topics.get(self.topic)
        if found is None or found.error is not None or not found.partitions:
            raise ConfigurationError(
                f"topic {self.topic!r} does not exist on {self.bootstrap_servers} "
                f"({found.error if found is not None else 'not listed'}); create it first"
            )
        return len(found.partitions)

    def _watermarks(self, consumer: confluent_kafka.Consumer, partition: int) -> tuple[int, int]:
        """``(log start offset, high watermark)`` of a partition, asked of its leader."""
        kafka = _kafka()
        try:
            low, high = consumer.get_watermark_offsets(
                kafka.TopicPartition(self.topic, partition),
                timeout=self.timeout_seconds,
                cached=False,
            )
        except kafka.KafkaException as exc:
            raise InputError(
                f"cannot read the offsets of topic {self.topic!r} partition {partition}: {exc}"
            ) from exc
        return int(low), int(high)


class KafkaPartitionReader:
    """Reads one partition of a :class:`KafkaTopic`; the continuation token is the next
    offset to read (8 bytes).

    The consumer is assigned the partition at the token's offset and prefetches from
    there; reads take what it has queued, so sequential reads cost no round trip each.
    """

    def __init__(self, source: KafkaTopic, partition: int) -> None:
        self._source = source
        self._partition = partition
        self._kafka = _kafka()
        self._consumer = source.consumer()
        self._schema = source.schema
        self._end = None if source.end_offsets is None else source.end_offsets[partition]
        self._buffer: list[Any] = []
        """Records fetched, in offset order; those from ``_head`` on are not returned yet."""
        self._head = 0
        self._position: int | None = None
        """The next offset the consumer delivers (after the buffer); None: not assigned."""
        self._native = self._core_reader() if source.native_reader else None
        """The core's reader, when the topic reads natively."""
        try:
            count = source._current_partition_count(self._consumer)
        except ConfigurationError as exc:
            self._consumer.close()
            # The brokers may be down for a while (a restart): the worker is restarted.
            raise MillstreamError(f"{self._where()}: {exc}") from exc
        if count != source.partition_count:
            self._consumer.close()
            raise ConfigurationError(
                f"topic {source.topic!r} now has {count} partitions, but this processor was "
                f"started with {source.partition_count}: a processor's partitions are fixed. "
                "Records of new partitions would never be read, so the processor stops; "
                "start a new processor (another name or store) to read every partition"
            )

    @property
    def partition(self) -> int:
        """The topic partition read."""
        return self._partition

    def _where(self) -> str:
        return f"topic {self._source.topic!r} partition {self._partition}"

    def _cursor(self) -> int | None:
        """The next offset this reader hands out."""
        if self._head < len(self._buffer):
            return int(self._buffer[self._head].offset())
        return self._position

    def _seek(self, offset: int) -> None:
        self._buffer, self._head = [], 0
        tp = self._kafka.TopicPartition(self._source.topic, self._partition, offset)
        if self._position is not None:
            self._consumer.unassign()
        self._consumer.assign([tp])
        self._position = offset

    def _finished(self, offset: int) -> bool:
        return self._end is not None and offset >= self._end

    def _fetch(self, count: int, timeout: float) -> bool:
        """Move up to ``count`` records from the consumer into the buffer; returns whether
        the partition's end (as known now) was reached."""
        messages = self._consumer.consume(count, timeout)
        if self._head >= len(self._buffer):
            self._buffer, self._head = [], 0
        if not messages:
            return False
        last = messages[-1]
        # The usual case, records only and none past the end, needs no step per record.
        if (
            last.error() is None
            and not self._finished(int(last.offset() or 0))
            and not any(m.error() is not None for m in messages)
        ):
            self._buffer.extend(messages)
            self._position = int(last.offset() or 0) + 1
            return False
        at_end = False
        for message in messages:
            error = message.error()
            offset = int(message.offset() or 0)
            if error is None:
                assert self._position is not None
                if self._finished(offset):
                    self._position = max(self._position, int(self._end or 0))
                    at_end = True
                    continue
                self._buffer.append(message)
                self._position = offset + 1
            elif error.code() == self._kafka.KafkaError._PARTITION_EOF:
                assert self._position is not None
                self._position = max(self._position, offset)
                at_end = True
            elif error.code() == self._kafka.KafkaError._AUTO_OFFSET_RESET:
                self._raise_out_of_range(offset)
            elif error.fatal():
                raise InputError(f"{self._where()}: the Kafka consumer failed: {error.str()}")
            else:
                log.warning("%s: %s (retried)", self._where(), error.str())
        return at_end

    def _raise_out_of_range(self, wanted: int) -> None:
        low, high = self._source._watermarks(self._consumer, self._partition)
        raise self._out_of_range(wanted, low, high)

    def _out_of_range(self, wanted: int, low: int, high: int) -> InputError:
        if wanted < low:
            return InputError(
                f"{self._where()}: records [{wanted}, {low}) were deleted (retention or "
                f"delete-records) before this processor read them; their effect is lost. "
                "Nothing was skipped: the processor stops here. To go on without them, start "
                f"a new processor reading from start_offsets={{{self._partition}: {low}}}, or "
                "restore the records"
            )
        return InputError(
            f"{self._where()}: this processor's next offset is {wanted} but the partition "
            f"holds offsets [{low}, {high}): the topic was deleted and recreated, or truncated. "
            "Start a new processor for the new topic"
        )

    def read(
        self, begin_row_index: int, end_row_index_hint: int, continuation_token: bytes
    ) -> ReadResult:
        """Return the committed records from the token's offset on, at most
        ``end_row_index_hint - begin_row_index`` of them."""
        offset = (
            _decode_token(continuation_token)
            if continuation_token
            else self._source.start_offset(self._partition)
        )
        want = max(1, end_row_index_hint - begin_row_index)
        if self._native is not None:
            return self._read_native(self._native, offset, want)
        if self._cursor() != offset:
            self._seek(offset)
        taken: list[Any] = []
        while len(taken) < want:
            if self._head < len(self._buffer):
                piece = self._buffer[self._head : self._head + want - len(taken)]
                self._head += len(piece)
                taken.extend(piece)
            if len(taken) >= want or self._finished(self._cursor() or 0):
                break
            # What is queued now, at once; wait a little only when nothing was taken yet.
            at_end = self._fetch(min(FETCH_MESSAGES, want - len(taken)), 0)
            if self._head >= len(self._buffer) and not at_end and not taken:
                at_end = self._fetch(min(FETCH_MESSAGES, want), FETCH_WAIT_SECONDS)
            if self._head >= len(self._buffer):
                break
        cursor = self._cursor()
        assert cursor is not None
        token = _encode_token(cursor)
        ended = self._finished(cursor)
        if not taken:
            return ReadResult(None, token, ended)
        return ReadResult(self._batch(taken), token, ended)

    def _read_native(self, native: CoreReader, offset: int, want: int) -> ReadResult:
        """:meth:`read` through the core's reader."""
        if self._finished(offset):
            return ReadResult(None, _encode_token(offset), True)
        try:
            records, cursor = native.read(offset, want, FETCH_WAIT_SECONDS)
        except KafkaOffsetOutOfRangeError as exc:
            _, wanted, low, high = exc.args
            raise self._out_of_range(wanted, low, high) from exc
        except KafkaReadError as exc:
            raise InputError(f"{self._where()}: {exc}") from exc
        token, ended = _encode_token(cursor), self._finished(cursor)
        if records is None:
            return ReadResult(None, token, ended)
        offsets = records.column("offset")
        arrays = [
            self._values(records.column("value"), lambda i: offsets[i].as_py())
            if name == "value"
            else records.column(name)
            for name in self._schema.names
        ]
        return ReadResult(pa.RecordBatch.from_arrays(arrays, schema=self._schema), token, ended)

    def _core_reader(self) -> CoreReader:
        config = {**CONSUMER_DEFAULTS, **self._source.config}
        settings = CoreReaderSettings(
            self._source.bootstrap_servers,
            self._source.topic,
            self._partition,
            self._end,
            client_id=str(config.get("client.id", "millstream")),
            timeout_seconds=self._source.timeout_seconds,
            fetch_bytes=int(config["max.partition.fetch.bytes"]),
            read_ahead_bytes=int(config["queued.max.messages.kbytes"]) * 1024,
        )
        return CoreReader(settings)

    def _batch(self, messages: Sequence[Any]) -> pa.RecordBatch:
        """The records as a batch of the columns read: one list comprehension per column
        (a call per record each), the rest in Arrow."""
        n = len(messages)
        arrays = []
        for name in self._schema.names:
            if name == "key":
                arrays.append(pa.array([m.key() for m in messages], type=pa.binary()))
            elif name == "value":
                values = pa.array([m.value() for m in messages], type=pa.binary())
                arrays.append(self._values(values, lambda i: int(messages[i].offset())))
            elif name == "timestamp":
                stamps = [m.timestamp() for m in messages]
                timestamps = [ts if kind else None for kind, ts in stamps]
                column = pa.array(timestamps, type=pa.int64())
                arrays.append(column.cast(pa.timestamp("ms", tz="UTC")))
            elif name == "headers":
                raw = [m.headers() for m in messages]
                if raw.count(None) == n:
                    arrays.append(pa.nulls(n, HEADERS_TYPE))
                else:
                    pairs = [
                        None if h is None else [{"key": k, "value": v} for k, v in h] for h in raw
                    ]
                    arrays.append(pa.array(pairs, type=HEADERS_TYPE))
            elif name == "partition":
                arrays.append(pa.array(np.full(n, self._partition, dtype=np.int32)))
            else:
                arrays.append(pa.array([m.offset() for m in messages], type=pa.int64()))
        return pa.RecordBatch.from_arrays(arrays, schema=self._schema)

    def _values(self, values: pa.Array, offset_of: Callable[[int], int]) -> pa.Array:
        """The raw ``values`` through the topic's decoder (``offset_of``: a value's offset)."""
        if isinstance(self._source.value, RawBytes):
            return values
        try:
            value = self._source.value.decode(values.to_pylist())
        except ValueDecodeError as exc:
            raise InputError(
                f"{self._where()}: the record at offset {offset_of(exc.index)} does not "
                f"decode with {self._source.value!r}: {exc.reason}. Fix the producer, or read "
                "the topic with a decoder that accepts it (RawBytes() takes any value)"
            ) from exc
        if value.type != self._source.value.value_type:
            raise InputError(
                f"{self._where()}: the decoder {self._source.value!r} returned {value.type}, "
                f"not its value_type {self._source.value.value_type}"
            )
        return value

    def wait_for_rows(self, begin_row_index: int, timeout_seconds: float) -> None:
        """Wait until a record is queued after the reader's position, at most
        ``timeout_seconds`` (see :class:`~millstream.inputs.base.WaitingReader`)."""
        if self._native is not None:
            self._native.wait(timeout_seconds)
            return
        if self._head < len(self._buffer) or self._position is None:
            return
        cursor = self._cursor()
        if cursor is not None and self._finished(cursor):
            return
        self._fetch(1, timeout_seconds)

    def trim(self, row_index: int, continuation_token: bytes) -> None:
        """Mirror the persisted position into the consumer group's committed offsets (if
        the topic has a ``group_id``); the records stay (retention deletes them)."""
        if self._source.group_id is None or not continuation_token:
            return
        offset = _decode_token(continuation_token)
        tp = self._kafka.TopicPartition(self._source.topic, self._partition, offset)
        try:
            self._consumer.commit(offsets=[tp], asynchronous=False)
        except self._kafka.KafkaException as exc:  # a mirror only: the next trim retries
            log.warning(
                "%s: could not commit offset %d to the group: %s", self._where(), offset, exc
            )

    def close(self) -> None:
        """Close the consumer and the core's reader."""
        if self._native is not None:
            self._native.close()
        self._consumer.close()


__all__ = ["COLUMNS", "CONSUMER_DEFAULTS", "KafkaPartitionReader", "KafkaTopic"]
