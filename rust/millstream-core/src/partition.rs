//! Stable hash partitioning: the reducer of a row is a pure function of its key values, the
//! same in every process, platform and release. The encoding is part of millstream's format
//! and pinned by golden-vector tests; changing it reroutes every key of a running processor.
//!
//! # The hash, exactly
//!
//! Each key value is first written in a canonical encoding (a tag byte, then a payload):
//!
//! | value | encoding |
//! | --- | --- |
//! | null (any type) | `0x00` |
//! | integer of any width, `-2^63 <= v < 2^63` | `0x01`, then `v` as little-endian `i64` |
//! | unsigned integer `v >= 2^63` | `0x02`, then `v` as little-endian `u64` |
//! | utf8, large_utf8, string_view | `0x03`, then the UTF-8 bytes |
//! | binary, large_binary | `0x04`, then the bytes |
//!
//! A dictionary-encoded value is encoded as the value it stands for (a null key or a null
//! dictionary value is null), so `int32 5`, `uint8 5` and `int64 5` agree, and a dictionary
//! string agrees with the plain string.
//!
//! The hash of a value is `xxh3_64(encoding)` (XXH3, 64 bits, seed 0). The hash of a row with
//! key columns `k0, k1, ...` is `h = hash(k0)`, then for each further column
//! `h = xxh3_64(le_bytes(h) ++ le_bytes(hash(ki)))`. The reducer is
//! `(h * num_reducers) >> 64` in 128-bit arithmetic (multiply-shift, which uses the high bits
//! of `h` and needs no division).

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{
    Array, ArrowPrimitiveType, DictionaryArray, GenericByteArray, Int32Array, RecordBatch,
};
use arrow_buffer::ArrowNativeType;
use arrow_schema::DataType;
use xxhash_rust::xxh3::xxh3_64;

use crate::error::{Error, Result};

const TAG_NULL: u8 = 0x00;
const TAG_INT: u8 = 0x01;
const TAG_UINT_HIGH: u8 = 0x02;
const TAG_UTF8: u8 = 0x03;
const TAG_BINARY: u8 = 0x04;

/// Hash of a null value of any type.
pub fn hash_null() -> u64 {
    xxh3_64(&[TAG_NULL])
}

/// Hash of a signed integer value (any width).
pub fn hash_i64(v: i64) -> u64 {
    let mut buf = [0u8; 9];
    buf[0] = TAG_INT;
    buf[1..].copy_from_slice(&v.to_le_bytes());
    xxh3_64(&buf)
}

/// Hash of an unsigned integer value (any width); equal to [`hash_i64`] below `2^63`.
pub fn hash_u64(v: u64) -> u64 {
    match i64::try_from(v) {
        Ok(v) => hash_i64(v),
        Err(_) => {
            let mut buf = [0u8; 9];
            buf[0] = TAG_UINT_HIGH;
            buf[1..].copy_from_slice(&v.to_le_bytes());
            xxh3_64(&buf)
        }
    }
}

fn hash_tagged(tag: u8, bytes: &[u8], scratch: &mut Vec<u8>) -> u64 {
    scratch.clear();
    scratch.push(tag);
    scratch.extend_from_slice(bytes);
    xxh3_64(scratch)
}

/// Hash of a string value.
pub fn hash_str(v: &str) -> u64 {
    hash_tagged(TAG_UTF8, v.as_bytes(), &mut Vec::new())
}

/// Hash of a binary value.
pub fn hash_bytes(v: &[u8]) -> u64 {
    hash_tagged(TAG_BINARY, v, &mut Vec::new())
}

/// Combines the hash so far of a row with the hash of its next key column.
#[inline]
pub fn combine(h: u64, next: u64) -> u64 {
    let mut buf = [0u8; 16];
    buf[..8].copy_from_slice(&h.to_le_bytes());
    buf[8..].copy_from_slice(&next.to_le_bytes());
    xxh3_64(&buf)
}

/// Maps a row hash onto `[0, num_reducers)`.
#[inline]
pub fn reducer_of(hash: u64, num_reducers: u32) -> u32 {
    ((u128::from(hash) * u128::from(num_reducers)) >> 64) as u32
}

/// Row hashes of the named key columns of `batch`.
pub fn hash_key_columns(batch: &RecordBatch, key_columns: &[&str]) -> Result<Vec<u64>> {
    if key_columns.is_empty() {
        return Err(Error::InvalidArgument(
            "name at least one key column to partition by".into(),
        ));
    }
    let schema = batch.schema();
    let mut hashes = Vec::new();
    let mut column_hashes = Vec::new();
    for (i, name) in key_columns.iter().enumerate() {
        let index = schema
            .index_of(name)
            .map_err(|_| Error::KeyColumnNotFound {
                name: (*name).to_owned(),
                available: schema.fields().iter().map(|f| f.name().clone()).collect(),
            })?;
        let target = if i == 0 {
            &mut hashes
        } else {
            &mut column_hashes
        };
        hash_array(batch.column(index).as_ref(), name, target)?;
        if i > 0 {
            for (h, c) in hashes.iter_mut().zip(&column_hashes) {
                *h = combine(*h, *c);
            }
        }
    }
    Ok(hashes)
}

/// Reducer index (`int32`) of every row of `batch`, from the named key columns.
pub fn partition(
    batch: &RecordBatch,
    key_columns: &[&str],
    num_reducers: u32,
) -> Result<Int32Array> {
    if num_reducers == 0 || num_reducers > i32::MAX as u32 {
        return Err(Error::InvalidArgument(format!(
            "num_reducers must be in [1, {}], got {num_reducers}",
            i32::MAX
        )));
    }
    let hashes = hash_key_columns(batch, key_columns)?;
    Ok(hashes
        .into_iter()
        .map(|h| reducer_of(h, num_reducers) as i32)
        .collect::<Vec<_>>()
        .into())
}

/// The canonical row order of a partitioned batch: rows sorted by their key hash, rows with
/// equal hashes in their original order.
///
/// The reducer is monotonic in the hash, so this order also groups the rows by reducer. It
/// depends only on the set of rows when keys are unique within the batch (a pre-aggregated
/// batch), not on the order a `map` produced them in: a `map` whose output order is
/// unspecified (a multi-threaded group-by) still gives every row the same shuffle index
/// after a restart.
pub fn hash_order(hashes: &[u64]) -> Result<Vec<u32>> {
    Ok(sorted_by_hash(hashes)?
        .into_iter()
        .map(|(_, row)| row)
        .collect())
}

/// `(hash, row)` pairs in [`hash_order`]: one counting-sort pass on the top bits (about
/// two rows per bucket), then a stable insertion sort, which only moves rows within a
/// bucket. Linear in the rows for hashes as uniform as XXH3's.
fn sorted_by_hash(hashes: &[u64]) -> Result<Vec<(u64, u32)>> {
    let n = hashes.len();
    if u32::try_from(n).is_err() {
        return Err(Error::InvalidArgument(format!(
            "a batch of {n} rows is too large to partition; map at most {} rows at once",
            u32::MAX
        )));
    }
    let bits = (usize::BITS - n.leading_zeros()).clamp(8, 24);
    let shift = 64 - bits;
    let mut starts = vec![0u32; 1 << bits];
    for &h in hashes {
        starts[(h >> shift) as usize] += 1;
    }
    let mut total = 0u32;
    for start in starts.iter_mut() {
        let count = *start;
        *start = total;
        total += count;
    }
    let mut pairs = vec![(0u64, 0u32); n];
    for (row, &h) in hashes.iter().enumerate() {
        let bucket = (h >> shift) as usize;
        pairs[starts[bucket] as usize] = (h, row as u32);
        starts[bucket] += 1;
    }
    for i in 1..n {
        let mut j = i;
        while j > 0 && pairs[j - 1].0 > pairs[j].0 {
            pairs.swap(j - 1, j);
            j -= 1;
        }
    }
    Ok(pairs)
}

/// Reducer index of every row in [`hash_order`], and that order: the rows of `batch`
/// taken in `order` are the canonical partitioned batch.
pub fn partition_in_hash_order(
    batch: &RecordBatch,
    key_columns: &[&str],
    num_reducers: u32,
) -> Result<(Vec<u32>, Int32Array)> {
    if num_reducers == 0 || num_reducers > i32::MAX as u32 {
        return Err(Error::InvalidArgument(format!(
            "num_reducers must be in [1, {}], got {num_reducers}",
            i32::MAX
        )));
    }
    let pairs = sorted_by_hash(&hash_key_columns(batch, key_columns)?)?;
    let reducers: Vec<i32> = pairs
        .iter()
        .map(|&(h, _)| reducer_of(h, num_reducers) as i32)
        .collect();
    Ok((
        pairs.into_iter().map(|(_, row)| row).collect(),
        reducers.into(),
    ))
}

/// Writes the per-row value hashes of one key column into `out` (cleared first).
pub fn hash_array(array: &dyn Array, name: &str, out: &mut Vec<u64>) -> Result<()> {
    out.clear();
    out.reserve(array.len());
    macro_rules! signed {
        ($t:ty) => {
            hash_primitive(array.as_primitive::<$t>(), out, |v| hash_i64(v as i64))
        };
    }
    macro_rules! unsigned {
        ($t:ty) => {
            hash_primitive(array.as_primitive::<$t>(), out, |v| hash_u64(v as u64))
        };
    }
    match array.data_type() {
        DataType::Int8 => signed!(Int8Type),
        DataType::Int16 => signed!(Int16Type),
        DataType::Int32 => signed!(Int32Type),
        DataType::Int64 => signed!(Int64Type),
        DataType::UInt8 => unsigned!(UInt8Type),
        DataType::UInt16 => unsigned!(UInt16Type),
        DataType::UInt32 => unsigned!(UInt32Type),
        DataType::UInt64 => unsigned!(UInt64Type),
        DataType::Utf8 => hash_byte_array(array.as_string::<i32>(), TAG_UTF8, out),
        DataType::LargeUtf8 => hash_byte_array(array.as_string::<i64>(), TAG_UTF8, out),
        DataType::Binary => hash_byte_array(array.as_binary::<i32>(), TAG_BINARY, out),
        DataType::LargeBinary => hash_byte_array(array.as_binary::<i64>(), TAG_BINARY, out),
        DataType::Utf8View => {
            let a = array.as_string_view();
            let mut scratch = Vec::new();
            out.extend((0..a.len()).map(|i| {
                if a.is_null(i) {
                    hash_null()
                } else {
                    hash_tagged(TAG_UTF8, a.value(i).as_bytes(), &mut scratch)
                }
            }));
        }
        DataType::Dictionary(key, _) => {
            macro_rules! dict {
                ($t:ty) => {
                    hash_dictionary(array.as_dictionary::<$t>(), name, out)?
                };
            }
            match key.as_ref() {
                DataType::Int8 => dict!(Int8Type),
                DataType::Int16 => dict!(Int16Type),
                DataType::Int32 => dict!(Int32Type),
                DataType::Int64 => dict!(Int64Type),
                DataType::UInt8 => dict!(UInt8Type),
                DataType::UInt16 => dict!(UInt16Type),
                DataType::UInt32 => dict!(UInt32Type),
                DataType::UInt64 => dict!(UInt64Type),
                _ => return Err(unsupported(array, name)),
            }
        }
        _ => return Err(unsupported(array, name)),
    }
    Ok(())
}

fn unsupported(array: &dyn Array, name: &str) -> Error {
    Error::UnsupportedKeyType {
        name: name.to_owned(),
        data_type: array.data_type().to_string(),
    }
}

fn hash_primitive<T: ArrowPrimitiveType>(
    a: &arrow_array::PrimitiveArray<T>,
    out: &mut Vec<u64>,
    f: impl Fn(T::Native) -> u64,
) {
    if a.null_count() == 0 {
        out.extend(a.values().iter().map(|&v| f(v)));
    } else {
        let null = hash_null();
        out.extend(a.iter().map(|v| v.map_or(null, &f)));
    }
}

fn hash_byte_array<T: arrow_array::types::ByteArrayType>(
    a: &GenericByteArray<T>,
    tag: u8,
    out: &mut Vec<u64>,
) {
    let mut scratch = Vec::new();
    let offsets = a.value_offsets();
    let values = a.value_data();
    let null = hash_null();
    for i in 0..a.len() {
        if a.is_null(i) {
            out.push(null);
        } else {
            let start = offsets[i].as_usize();
            let end = offsets[i + 1].as_usize();
            out.push(hash_tagged(tag, &values[start..end], &mut scratch));
        }
    }
}

fn hash_dictionary<K: ArrowDictionaryKeyType>(
    a: &DictionaryArray<K>,
    name: &str,
    out: &mut Vec<u64>,
) -> Result<()> {
    let mut value_hashes = Vec::new();
    hash_array(a.values().as_ref(), name, &mut value_hashes)?;
    let null = hash_null();
    let keys = a.keys();
    for i in 0..keys.len() {
        if keys.is_null(i) {
            out.push(null);
        } else {
            let k = keys.value(i).as_usize();
            out.push(*value_hashes.get(k).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "dictionary key {k} of column {name:?} is outside its dictionary"
                ))
            })?);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::builder::StringDictionaryBuilder;
    use arrow_array::{
        ArrayRef, BinaryArray, Int64Array, Int8Array, LargeStringArray, StringArray,
        StringViewArray, UInt64Array,
    };

    use super::*;

    #[test]
    fn xxh3_is_the_reference_function() {
        // Reference value of XXH3_64bits("") from the xxHash specification.
        assert_eq!(xxh3_64(b""), 0x2D06_8005_38D3_94C2);
    }

    #[test]
    fn golden_values() {
        // Pinned: these numbers are part of millstream's format. Also pinned in
        // tests/unit/core/test_partition.py.
        assert_eq!(hash_null(), GOLDEN_NULL);
        assert_eq!(hash_i64(0), GOLDEN_I0);
        assert_eq!(hash_i64(5), GOLDEN_I5);
        assert_eq!(hash_i64(-1), GOLDEN_IM1);
        assert_eq!(hash_u64(u64::MAX), GOLDEN_UMAX);
        assert_eq!(hash_str("apple"), GOLDEN_APPLE);
        assert_eq!(hash_str(""), GOLDEN_EMPTY_STR);
        assert_eq!(hash_bytes(b"apple"), GOLDEN_APPLE_BYTES);
        assert_eq!(combine(hash_str("apple"), hash_i64(5)), GOLDEN_APPLE_5);
        assert_eq!(reducer_of(GOLDEN_APPLE, 16), GOLDEN_APPLE_R16);
    }

    // GOLDEN_NULL was also derived by hand from the XXH3 specification (1-byte input path).
    const GOLDEN_NULL: u64 = 0xC44B_DFF4_074E_ECDB;
    const GOLDEN_I0: u64 = 0x313C_2DD2_EC99_6E80;
    const GOLDEN_I5: u64 = 0xD7AA_C30B_7EE8_29FB;
    const GOLDEN_IM1: u64 = 0x53A5_F4BC_2FC0_168C;
    const GOLDEN_UMAX: u64 = 0x5195_7C45_5B8E_6C65;
    const GOLDEN_APPLE: u64 = 0x89C7_89FB_EFED_B452;
    const GOLDEN_EMPTY_STR: u64 = 0x13E6_08BC_156D_EFED;
    const GOLDEN_APPLE_BYTES: u64 = 0xF539_602A_644B_22F0;
    const GOLDEN_APPLE_5: u64 = 0xCFF5_4D90_8A83_073D;
    const GOLDEN_APPLE_R16: u32 = 8;

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).unwrap()
    }

    #[test]
    fn hash_order_sorts_by_hash_and_keeps_ties_in_row_order() {
        let hashes = [5u64, 1 << 40, 3, 5, u64::MAX, 0, 3 << 56, 5];
        let order = hash_order(&hashes).unwrap();
        assert_eq!(order, vec![5, 2, 0, 3, 7, 1, 6, 4]);
        assert!(hash_order(&[]).unwrap().is_empty());
        // Many rows per bucket of the top bits: the insertion sort orders them.
        let crowded: Vec<u64> = (0..5000u64).map(|i| (i * 7919) % 5000).collect();
        let order = hash_order(&crowded).unwrap();
        let sorted: Vec<u64> = order.iter().map(|&i| crowded[i as usize]).collect();
        assert!(sorted.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn partition_in_hash_order_ignores_the_input_order() {
        let keys: Vec<i64> = (0..1000).map(|i| (i * 7919) % 1000).collect();
        let reversed: Vec<i64> = keys.iter().rev().copied().collect();
        let a = batch(vec![(
            "k",
            Arc::new(Int64Array::from(keys.clone())) as ArrayRef,
        )]);
        let b = batch(vec![(
            "k",
            Arc::new(Int64Array::from(reversed)) as ArrayRef,
        )]);
        let (order_a, reducers_a) = partition_in_hash_order(&a, &["k"], 4).unwrap();
        let (order_b, reducers_b) = partition_in_hash_order(&b, &["k"], 4).unwrap();
        let rows_a: Vec<i64> = order_a.iter().map(|&i| keys[i as usize]).collect();
        let rows_b: Vec<i64> = order_b.iter().map(|&i| keys[999 - i as usize]).collect();
        assert_eq!(rows_a, rows_b);
        assert_eq!(reducers_a, reducers_b);
        let r: Vec<i32> = reducers_a.values().to_vec();
        assert!(
            r.windows(2).all(|w| w[0] <= w[1]),
            "rows are grouped by reducer"
        );
    }

    #[test]
    fn integer_widths_agree_by_value() {
        let b = batch(vec![
            (
                "a",
                Arc::new(Int8Array::from(vec![Some(5), None, Some(-1)])) as ArrayRef,
            ),
            (
                "b",
                Arc::new(Int64Array::from(vec![Some(5), None, Some(-1)])),
            ),
            (
                "c",
                Arc::new(UInt64Array::from(vec![Some(5), None, Some(u64::MAX)])),
            ),
        ]);
        let a = hash_key_columns(&b, &["a"]).unwrap();
        let bb = hash_key_columns(&b, &["b"]).unwrap();
        let c = hash_key_columns(&b, &["c"]).unwrap();
        assert_eq!(a, bb);
        assert_eq!(a[..2], c[..2]);
        assert_ne!(a[2], c[2]);
        assert_eq!(a, vec![hash_i64(5), hash_null(), hash_i64(-1)]);
    }

    #[test]
    fn string_types_and_dictionaries_agree() {
        let values = vec![Some("x"), None, Some("apple"), Some("")];
        let mut dict = StringDictionaryBuilder::<Int32Type>::new();
        for v in &values {
            dict.append_option(*v);
        }
        let b = batch(vec![
            ("s", Arc::new(StringArray::from(values.clone())) as ArrayRef),
            ("l", Arc::new(LargeStringArray::from(values.clone()))),
            ("v", Arc::new(StringViewArray::from(values.clone()))),
            ("d", Arc::new(dict.finish())),
        ]);
        let s = hash_key_columns(&b, &["s"]).unwrap();
        for name in ["l", "v", "d"] {
            assert_eq!(hash_key_columns(&b, &[name]).unwrap(), s, "{name}");
        }
        assert_eq!(s[2], hash_str("apple"));
        assert_eq!(s[1], hash_null());
    }

    #[test]
    fn binary_differs_from_string() {
        let b = batch(vec![
            ("s", Arc::new(StringArray::from(vec!["apple"])) as ArrayRef),
            ("b", Arc::new(BinaryArray::from(vec![b"apple".as_ref()]))),
        ]);
        assert_ne!(
            hash_key_columns(&b, &["s"]).unwrap(),
            hash_key_columns(&b, &["b"]).unwrap()
        );
    }

    #[test]
    fn columns_combine_in_order() {
        let b = batch(vec![
            ("s", Arc::new(StringArray::from(vec!["apple"])) as ArrayRef),
            ("i", Arc::new(Int64Array::from(vec![5]))),
        ]);
        assert_eq!(
            hash_key_columns(&b, &["s", "i"]).unwrap(),
            vec![combine(hash_str("apple"), hash_i64(5))]
        );
        assert_ne!(
            hash_key_columns(&b, &["s", "i"]).unwrap(),
            hash_key_columns(&b, &["i", "s"]).unwrap()
        );
    }

    #[test]
    fn reducers_are_in_range_and_spread() {
        let n = 7;
        let b = batch(vec![(
            "k",
            Arc::new(Int64Array::from((0..70_000).collect::<Vec<i64>>())) as ArrayRef,
        )]);
        let r = partition(&b, &["k"], n).unwrap();
        let mut counts = [0usize; 7];
        for v in r.values() {
            counts[*v as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| c > 9_000 && c < 11_000),
            "{counts:?}"
        );
    }

    #[test]
    fn errors_name_the_problem() {
        let b = batch(vec![(
            "f",
            Arc::new(arrow_array::Float64Array::from(vec![1.0])) as ArrayRef,
        )]);
        let e = partition(&b, &["f"], 2).unwrap_err().to_string();
        assert!(e.contains("\"f\"") && e.contains("Float64"), "{e}");
        let e = partition(&b, &["nope"], 2).unwrap_err().to_string();
        assert!(e.contains("\"nope\"") && e.contains("[\"f\"]"), "{e}");
        assert!(partition(&b, &["f"], 0).is_err());
        assert!(partition(&b, &[], 2).is_err());
    }
}
