"""Compare a system's per-key results with the expected ones, key by key."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class Verification:
    """Outcome of comparing every key.

    Attributes:
        expected_keys: Keys in the expected results.
        actual_keys: Keys the system produced.
        missing: Expected keys the system did not produce.
        unexpected: Keys the system produced that are not expected.
        mismatched: Keys present on both sides with a different value in some column.
        examples: A few differing rows, for the error message.
    """

    expected_keys: int
    actual_keys: int
    missing: int
    unexpected: int
    mismatched: int
    examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every key matches."""
        return self.missing == 0 and self.unexpected == 0 and self.mismatched == 0

    def summary(self) -> str:
        """One line for logs."""
        if self.ok:
            return f"exact: all {self.expected_keys:,} keys match"
        return (
            f"WRONG: {self.missing} missing, {self.unexpected} unexpected, "
            f"{self.mismatched} mismatched of {self.expected_keys:,} keys; e.g. {self.examples}"
        )


def compare(expected: pa.Table, actual: pa.Table, key: str = "key") -> Verification:
    """Full outer join on ``key`` and a null-safe comparison of every other column.

    Both tables must have the same column names. Duplicate keys in ``actual`` count as
    mismatches (a sink must hold one row per key).
    """
    if sorted(expected.column_names) != sorted(actual.column_names):
        raise ValueError(f"columns differ: {expected.column_names} vs {actual.column_names}")
    actual = actual.select(expected.column_names).cast(expected.schema)
    duplicates = actual.num_rows - pc.count_distinct(actual[key]).as_py()
    expected = expected.append_column("__expected", pa.repeat(True, expected.num_rows))
    actual = actual.append_column("__actual", pa.repeat(True, actual.num_rows))
    joined = expected.join(actual, key, join_type="full outer", right_suffix="__a")
    in_expected = pc.fill_null(joined["__expected"], False)
    in_actual = pc.fill_null(joined["__actual"], False)
    both = pc.and_(in_expected, in_actual)
    differs = pa.repeat(False, joined.num_rows)
    for name in expected.column_names:
        if name in (key, "__expected"):
            continue
        left, right = joined[name], joined[f"{name}__a"]
        same = pc.or_(
            pc.fill_null(pc.equal(left, right), False),
            pc.and_(pc.is_null(left), pc.is_null(right)),
        )
        differs = pc.or_(differs, pc.invert(same))
    bad = pc.and_(both, differs)
    rows = joined.filter(pc.or_(bad, pc.invert(both))).slice(0, 3).to_pylist()
    return Verification(
        expected_keys=expected.num_rows,
        actual_keys=actual.num_rows,
        missing=pc.sum(pc.and_(in_expected, pc.invert(in_actual))).as_py() or 0,
        unexpected=pc.sum(pc.and_(in_actual, pc.invert(in_expected))).as_py() or 0,
        mismatched=(pc.sum(bad).as_py() or 0) + duplicates,
        examples=rows,
    )
