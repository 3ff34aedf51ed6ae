"""Schema unification: the one rule for which schema changes are safe and what they become.

Streams change shape: a producer adds a nullable column, widens ``int32`` to ``int64``,
writes its columns in another order, or dictionary-encodes a string column. This module
says which of those changes millstream accepts and the schema rows of several schemas are
carried in, so that every input and every worker applies the same rule.

**Safe changes** (Arrow's: every value of the old type is a value of the new one):

- a column added, if it is nullable (earlier rows hold null there); a column dropped
  (later rows hold null there: the unified column becomes nullable);
- a column's nullability relaxed (``not null`` to nullable);
- a type widened: ``int8 -> int16 -> int32 -> int64``, ``uint8 -> uint16 -> uint32 ->
  uint64``, an unsigned type to the signed type twice its width (``uint32 -> int64``),
  ``float16 -> float32 -> float64``, any integer to ``float64`` for the values
  ``float64`` holds exactly (every value of up to 32 bits; 64-bit values up to 2**53 in
  magnitude: a value beyond that stops the cast of its rows with an error naming the
  column, never a rounded number), ``string -> large_string``, ``binary ->
  large_binary``, and the ``null`` type (a column of nulls only) to any type;
- columns reordered (the unified schema keeps the order they were first seen in);
- a dictionary-encoded column beside a plain one of its value type (the unified column is
  plain: the value type).

**Unsafe changes** raise :class:`~millstream.exceptions.SchemaEvolutionError` naming the
column and both types: a type narrowed, a non-null column added, a type changed to one
that does not hold the old values (``int64`` to ``string``, ``int32`` to ``uint32``), and
a schema that shares no column with the rows before it (another stream's rows).

Two operations, one per situation:

- :func:`evolve` is the rule *within one ordered stream* (a partition's files, a store
  queue partition's appends): a later schema must be a safe change of everything before
  it, so a narrowed type is refused there even though the narrow values would fit.
- :func:`unify` is the rule *across streams* (partitions, mappers, rows of any age): the
  least schema every given one casts into without loss; it fails only on types that have
  no common one.

**Where it applies.** Inputs check (:func:`evolve`) but do not convert: ``map`` sees each
batch as it was written, and a read never returns rows of two schemas in one batch. The
mapped rows are unified (:func:`unify`, :func:`conform`) before they enter the window,
because ``map``'s output is what the window, GetRows and the reducers carry, and it may
change shape whether or not its input did (a mapper that passes rows through widens when
they widen; one that aggregates may not). Unifying the input alone would not make the
window's rows one schema, and unifying it before ``map`` would hide from ``map`` what was
written. A mapper persists its window's unified schema in the store (it only ever
widens), so a restarted mapper, which replays from its persisted input index, casts the
replayed rows into it again and its reducers receive one schema. Reducers unify the rows
of one round from several mappers (and spilled rows) with :func:`concat`.

The no-change path is one schema equality check.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from millstream.exceptions import SchemaEvolutionError

_SIGNED = {pa.int8(): 8, pa.int16(): 16, pa.int32(): 32, pa.int64(): 64}
_UNSIGNED = {pa.uint8(): 8, pa.uint16(): 16, pa.uint32(): 32, pa.uint64(): 64}
_FLOATS = {pa.float16(): 16, pa.float32(): 32, pa.float64(): 64}
_SIGNED_OF = {bits: kind for kind, bits in _SIGNED.items()}
_UNSIGNED_OF = {bits: kind for kind, bits in _UNSIGNED.items()}
_FLOAT_OF = {bits: kind for kind, bits in _FLOATS.items()}
_LARGE = {pa.string(): pa.large_string(), pa.binary(): pa.large_binary()}


def _plain(kind: pa.DataType) -> pa.DataType:
    """The value type of a dictionary type; any other type itself."""
    return kind.value_type if pa.types.is_dictionary(kind) else kind


def _integer_join(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The least integer type holding every value of both integer types (None: none does)."""
    if a in _SIGNED and b in _SIGNED:
        return _SIGNED_OF[max(_SIGNED[a], _SIGNED[b])]
    if a in _UNSIGNED and b in _UNSIGNED:
        return _UNSIGNED_OF[max(_UNSIGNED[a], _UNSIGNED[b])]
    signed, unsigned = (a, b) if a in _SIGNED else (b, a)
    return _SIGNED_OF.get(max(_SIGNED[signed], 2 * _UNSIGNED[unsigned]))


def common_type(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The least type that holds every value of ``a`` and of ``b`` (None: no such type).

    A dictionary type stands for its value type; the result of a dictionary type and any
    other type is plain.
    """
    if a == b:
        return a
    a, b = _plain(a), _plain(b)
    if a == b:
        return a
    if pa.types.is_null(a):
        return b
    if pa.types.is_null(b):
        return a
    integers = _SIGNED.keys() | _UNSIGNED.keys()
    if a in integers and b in integers:
        return _integer_join(a, b)
    if a in _FLOATS and b in _FLOATS:
        return _FLOAT_OF[max(_FLOATS[a], _FLOATS[b])]
    if (a in _FLOATS and b in integers) or (b in _FLOATS and a in integers):
        return pa.float64()
    if _LARGE.get(a) == b or _LARGE.get(b) == a:
        return _LARGE.get(a, a)
    return None


def widens_to(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether ``new`` holds every value of ``old`` (equal types included)."""
    return bool(old == new or common_type(old, new) == _plain(new))


def _describe(field: pa.Field) -> str:
    return f"{field.type}{'' if field.nullable else ' not null'}"


def _field_join(a: pa.Field, b: pa.Field) -> pa.Field:
    kind = common_type(a.type, b.type)
    if kind is None:
        raise SchemaEvolutionError(
            a.name, _describe(a), _describe(b), "the types hold different kinds of values"
        )
    return pa.field(a.name, kind, a.nullable or b.nullable, a.metadata)


def _by_name(schema: pa.Schema) -> dict[str, pa.Field]:
    fields = {field.name: field for field in schema}
    if len(fields) != len(schema):
        twice = sorted({n for n in schema.names if schema.names.count(n) > 1})
        raise SchemaEvolutionError(
            twice[0],
            "one column",
            "two columns of that name",
            "columns are matched by name, so a schema that changes must name each once",
        )
    return fields


def unify(a: pa.Schema, b: pa.Schema) -> pa.Schema:
    """The least schema that rows of ``a`` and of ``b`` both cast into without loss.

    Columns keep ``a``'s order, then ``b``'s new ones; a column missing from either is
    nullable. ``a``'s schema metadata is kept.

    Raises:
        SchemaEvolutionError: A column's two types have no common type.
    """
    if a.equals(b):
        return a
    ours, theirs = _by_name(a), _by_name(b)
    fields = []
    for name, field in ours.items():
        other = theirs.get(name)
        fields.append(field.with_nullable(True) if other is None else _field_join(field, other))
    fields.extend(field.with_nullable(True) for name, field in theirs.items() if name not in ours)
    return pa.schema(fields, metadata=a.metadata)


def evolve(unified: pa.Schema, new: pa.Schema) -> pa.Schema:
    """Check that ``new`` is a safe change of a stream whose rows so far unify to
    ``unified``; returns the stream's unified schema with ``new`` (``unify``).

    Raises:
        SchemaEvolutionError: A column of ``new`` narrows or changes its type, or is a
            column ``unified`` lacks that is not nullable, or ``new`` shares no column
            with ``unified``.
    """
    if unified.equals(new):
        return unified
    before = _by_name(unified)
    if len(new) and len(unified) and not before.keys() & set(new.names):
        raise SchemaEvolutionError(
            new.names[0],
            "(absent)",
            _describe(new.field(0)),
            f"the schema shares no column with the earlier rows' ({', '.join(unified.names)}): "
            "rows of another stream, not a change of this one",
        )
    for field in new:
        old = before.get(field.name)
        if old is None:
            if not field.nullable:
                raise SchemaEvolutionError(
                    field.name, "(absent)", _describe(field),
                    "a column added later must be nullable: earlier rows have no value there",
                )  # fmt: skip
        elif not widens_to(old.type, field.type):
            narrowed = widens_to(field.type, old.type)
            raise SchemaEvolutionError(
                field.name,
                _describe(old),
                _describe(field),
                "the type narrowed: earlier rows may hold values it cannot"
                if narrowed
                else "the new type does not hold the earlier values",
            )
    return unify(unified, new)


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` cast into ``schema``, a schema it unifies into (:func:`unify`): columns by
    name and in ``schema``'s order, types widened, dictionaries decoded, missing columns
    null. Returns ``batch`` itself when its schema is ``schema`` already.

    Raises:
        SchemaEvolutionError: A value does not fit the wider type (an integer beyond 2**53
            cast to ``float64``).
    """
    if batch.schema.equals(schema):
        return batch
    columns = []
    for field in schema:
        index = batch.schema.get_field_index(field.name)
        if index < 0:
            columns.append(pa.nulls(batch.num_rows, field.type))
            continue
        column = batch.column(index)
        if pa.types.is_dictionary(column.type) and not pa.types.is_dictionary(field.type):
            column = column.dictionary_decode()
        if column.type != field.type:
            try:
                column = column.cast(field.type)
            except pa.ArrowInvalid as exc:
                raise SchemaEvolutionError(
                    field.name, str(column.type), str(field.type), f"a value does not fit ({exc})"
                ) from exc
        columns.append(column)
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def unify_all(schemas: Sequence[pa.Schema]) -> pa.Schema:
    """:func:`unify` over several schemas, in order (at least one).

    Raises:
        SchemaEvolutionError: Two of them have a column whose types have no common type.
    """
    out = schemas[0]
    for schema in schemas[1:]:
        out = unify(out, schema)
    return out


def concat_tables(tables: Sequence[pa.Table]) -> pa.Table:
    """The rows of ``tables`` (at least one) as one table of their unified schema; the
    chunks are kept as they are when every table has that schema already.

    Raises:
        SchemaEvolutionError: Two tables have a column whose types have no common type.
    """
    schema = unify_all([t.schema for t in tables])
    return pa.concat_tables(
        [
            t
            if t.schema.equals(schema)
            else pa.Table.from_batches([conform(b, schema) for b in t.to_batches()], schema)
            for t in tables
        ]
    )


def concat(batches: Sequence[pa.RecordBatch]) -> pa.RecordBatch:
    """The rows of ``batches`` (at least one) as one batch of their unified schema.

    Raises:
        SchemaEvolutionError: Two batches have a column whose types have no common type.
    """
    if len(batches) == 1:
        return batches[0]
    table = concat_tables([pa.Table.from_batches([b]) for b in batches]).combine_chunks()
    out = table.to_batches()
    return out[0] if out else pa.RecordBatch.from_pylist([], schema=table.schema)


__all__ = [
    "common_type",
    "concat",
    "concat_tables",
    "conform",
    "evolve",
    "unify",
    "unify_all",
    "widens_to",
]
