"""How a Kafka record's value becomes the ``value`` column of the batches a mapper reads.

A decoder turns the raw values of one fetched batch into one Arrow array; a value that does
not decode raises :class:`ValueDecodeError` naming its position in the batch, which the
reader turns into an error naming the record's topic, partition and offset. Three decoders
ship: :class:`RawBytes` (the default: no decoding), :class:`Json` and :class:`Avro`
(schemaless Avro binary, optionally in the Confluent wire format). Any object with
``value_type`` and ``decode`` is a decoder; it must pickle (workers are processes).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from millstream.exceptions import ConfigurationError


class ValueDecodeError(ValueError):
    """The value at ``index`` of a batch does not decode (``reason`` says why)."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"value {index} of the batch: {reason}")
        self.index = index
        self.reason = reason


@runtime_checkable
class ValueDecoder(Protocol):
    """Decodes the values of a batch of Kafka records (``None`` is a tombstone)."""

    @property
    def value_type(self) -> pa.DataType:
        """The Arrow type of the ``value`` column."""
        ...

    def decode(self, values: Sequence[bytes | None]) -> pa.Array:
        """The values as one array of :attr:`value_type`.

        Raises:
            ValueDecodeError: A value does not decode; its ``index`` names it.
        """
        ...


@dataclass(frozen=True)
class RawBytes:
    """Values as they are: a ``binary`` column (the default decoder)."""

    @property
    def value_type(self) -> pa.DataType:
        """``binary``."""
        return pa.binary()

    def decode(self, values: Sequence[bytes | None]) -> pa.Array:
        """The values, undecoded."""
        return pa.array(values, type=pa.binary())


def _struct_type(schema: pa.Schema | pa.StructType) -> pa.StructType:
    if isinstance(schema, pa.Schema):
        return pa.struct(list(schema))
    if isinstance(schema, pa.StructType):
        return schema
    raise ConfigurationError(
        f"Json needs the values' Arrow schema (a pyarrow.Schema or struct type), got {schema!r}"
    )


@dataclass(frozen=True)
class Json:
    """Values that are JSON objects, decoded into a ``struct`` column of ``schema``.

    A field missing from an object is null; a field not in ``schema`` is ignored. The
    schema is fixed up front so that every batch has the same type, whatever its rows hold.

    Args:
        schema: The objects' fields and their Arrow types.
    """

    schema: pa.Schema | pa.StructType

    def __post_init__(self) -> None:
        _struct_type(self.schema)

    @property
    def value_type(self) -> pa.DataType:
        """A struct of the schema's fields."""
        return _struct_type(self.schema)

    def decode(self, values: Sequence[bytes | None]) -> pa.Array:
        """Parse each value as a JSON object."""
        objects: list[dict[str, Any] | None] = []
        for index, value in enumerate(values):
            if value is None:
                objects.append(None)
                continue
            try:
                obj = json.loads(value)
            except ValueError as exc:
                raise ValueDecodeError(index, f"not JSON ({exc})") from exc
            if not isinstance(obj, dict):
                raise ValueDecodeError(index, f"a JSON {type(obj).__name__}, not an object")
            objects.append(obj)
        try:
            return pa.array(objects, type=self.value_type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            for index, obj in enumerate(objects):
                try:
                    pa.array([obj], type=self.value_type)
                except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
                    raise ValueDecodeError(
                        index, f"the object {obj!r:.200} does not fit {self.value_type}: {exc}"
                    ) from exc
            raise


_AVRO_PRIMITIVES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}


def _avro_arrow_type(schema: Any, named: dict[str, pa.DataType]) -> pa.DataType:
    """The Arrow type of an Avro schema (records, arrays, maps, enums, nullable unions)."""
    if isinstance(schema, str):
        if schema in _AVRO_PRIMITIVES:
            return _AVRO_PRIMITIVES[schema]
        if schema in named:
            return named[schema]
        raise ConfigurationError(f"Avro type {schema!r} is not supported by the Avro decoder")
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            raise ConfigurationError(
                f'Avro union {schema!r}: only ["null", T] unions map to Arrow columns'
            )
        return _avro_arrow_type(branches[0], named)
    if isinstance(schema, Mapping):
        kind = schema.get("type")
        if kind == "record":
            fields = [
                pa.field(f["name"], _avro_arrow_type(f["type"], named)) for f in schema["fields"]
            ]
            out: pa.DataType = pa.struct(fields)
        elif kind == "array":
            out = pa.list_(_avro_arrow_type(schema["items"], named))
        elif kind == "map":
            out = pa.map_(pa.string(), _avro_arrow_type(schema["values"], named))
        elif kind == "enum":
            out = pa.string()
        elif kind == "fixed":
            out = pa.binary(int(schema["size"]))
        else:
            return _avro_arrow_type(kind, named)
        if "name" in schema:
            named[str(schema["name"])] = out
        return out
    raise ConfigurationError(f"not an Avro schema: {schema!r}")


@dataclass(frozen=True)
class Avro:
    """Values in Avro binary encoding (one datum each, no container), decoded with fastavro
    into a ``struct`` column (for a record schema).

    Args:
        schema: The writer's Avro schema (a dict as parsed from JSON).
        confluent_framing: Values start with the Confluent Schema Registry header (a zero
            byte and a 4-byte schema id), which is skipped; the schema is still the one
            given here (no registry is consulted).
    """

    schema: Mapping[str, Any]
    confluent_framing: bool = False
    _arrow_type: pa.DataType = field(init=False, repr=False, compare=False)
    _parsed: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            import fastavro
        except ImportError as exc:  # pragma: no cover - a dependency of the kafka extra
            raise ConfigurationError(
                "the Avro decoder needs fastavro: pip install 'millstream[kafka]'"
            ) from exc
        try:
            parsed = fastavro.parse_schema(dict(self.schema))
        except Exception as exc:
            raise ConfigurationError(f"not a valid Avro schema: {exc}") from exc
        object.__setattr__(self, "_parsed", parsed)
        object.__setattr__(self, "_arrow_type", _avro_arrow_type(dict(self.schema), {}))

    def __getstate__(self) -> dict[str, Any]:
        return {"schema": dict(self.schema), "confluent_framing": self.confluent_framing}

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "schema", state["schema"])
        object.__setattr__(self, "confluent_framing", state["confluent_framing"])
        self.__post_init__()

    @property
    def value_type(self) -> pa.DataType:
        """The Arrow type of the schema."""
        return self._arrow_type

    def decode(self, values: Sequence[bytes | None]) -> pa.Array:
        """Decode each value with the writer's schema."""
        import fastavro

        parsed = self._parsed
        skip = 5 if self.confluent_framing else 0
        data: list[Any] = []
        for index, value in enumerate(values):
            if value is None:
                data.append(None)
                continue
            if skip and (len(value) < skip or value[0] != 0):
                raise ValueDecodeError(index, "no Confluent wire-format header (magic byte 0)")
            stream = io.BytesIO(value)
            stream.seek(skip)
            try:
                datum = fastavro.schemaless_reader(stream, parsed, None)
            except Exception as exc:
                raise ValueDecodeError(index, f"not Avro of the given schema ({exc!r})") from exc
            if stream.tell() != len(value):
                raise ValueDecodeError(
                    index,
                    f"not Avro of the given schema ({len(value) - stream.tell()} bytes left "
                    "after the datum)",
                )
            data.append(datum)
        return pa.array(data, type=self._arrow_type)


__all__ = ["Avro", "Json", "RawBytes", "ValueDecodeError", "ValueDecoder"]
