//! Counter lanes: several int64 counters kept in one stored value, little-endian and back to
//! back, added lane by lane (each lane wrapping around in 64 bits, no carry between lanes).
//!
//! The same rules as `millstream.state.keys.add_int64s` and `fold_int64s`: a stored value
//! of another width is cut or zero-extended to the delta's width (what FoundationDB's `ADD`
//! does to a whole value), and the deltas of a key repeated in one batch are added together
//! first.

use std::collections::HashMap;

/// `base` plus `delta` lane by lane, as the value to store: `delta.len()` lanes, each an
/// int64 wrapping around; a shorter `base` (or none) is zero-extended, a longer one cut.
pub fn add(base: Option<&[u8]>, delta: &[i64]) -> Vec<u8> {
    let width = 8 * delta.len();
    let mut out = vec![0u8; width];
    let base = base.unwrap_or_default();
    let kept = base.len().min(width);
    out[..kept].copy_from_slice(&base[..kept]);
    for (lane, d) in out.chunks_exact_mut(8).zip(delta) {
        let stored = i64::from_le_bytes(lane.try_into().expect("an 8-byte lane"));
        lane.copy_from_slice(&stored.wrapping_add(*d).to_le_bytes());
    }
    out
}

/// A batch's keys, each once in order of first appearance, with their lanes added together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Folded<'k> {
    /// The distinct keys.
    pub keys: Vec<&'k [u8]>,
    /// `width` lanes per key of `keys`, row after row.
    pub deltas: Vec<i64>,
    /// Lanes per key.
    pub width: usize,
}

impl<'k> Folded<'k> {
    /// Folds `deltas` (`width` lanes per key, row after row, aligned with `keys`).
    ///
    /// # Panics
    ///
    /// If `width` is 0 or `deltas` does not hold `width` lanes for every key.
    pub fn new(keys: &[&'k [u8]], deltas: &[i64], width: usize) -> Self {
        assert!(width > 0, "counter lanes need a width of at least one");
        assert_eq!(deltas.len(), keys.len() * width, "one row of lanes per key");
        let mut index: HashMap<&'k [u8], usize> = HashMap::with_capacity(keys.len());
        let mut folded = Folded {
            keys: Vec::with_capacity(keys.len()),
            deltas: Vec::with_capacity(deltas.len()),
            width,
        };
        for (key, row) in keys.iter().zip(deltas.chunks_exact(width)) {
            match index.get(key) {
                Some(&i) => {
                    let lanes = &mut folded.deltas[i * width..(i + 1) * width];
                    for (lane, d) in lanes.iter_mut().zip(row) {
                        *lane = lane.wrapping_add(*d);
                    }
                }
                None => {
                    index.insert(key, folded.keys.len());
                    folded.keys.push(key);
                    folded.deltas.extend_from_slice(row);
                }
            }
        }
        folded
    }

    /// The lanes of the `i`th distinct key.
    pub fn lanes(&self, i: usize) -> &[i64] {
        &self.deltas[i * self.width..(i + 1) * self.width]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lanes_of(value: &[u8]) -> Vec<i64> {
        value
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn each_lane_wraps_on_its_own() {
        let base: Vec<u8> = [i64::MAX, i64::MIN, 5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let out = add(Some(&base), &[1, -1, -7]);
        assert_eq!(lanes_of(&out), vec![i64::MIN, i64::MAX, -2]);
    }

    #[test]
    fn a_base_of_another_width_is_cut_or_zero_extended() {
        assert_eq!(lanes_of(&add(None, &[3, 4])), vec![3, 4]);
        assert_eq!(lanes_of(&add(Some(&[1]), &[1, 1])), vec![2, 1]);
        let wide: Vec<u8> = [9i64, 8, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(lanes_of(&add(Some(&wide), &[1, 1])), vec![10, 9]);
        let ragged = [0xffu8; 11]; // one lane of -1, then three bytes of the next
        assert_eq!(lanes_of(&add(Some(&ragged), &[1, 0])), vec![0, 0xff_ffff]);
    }

    #[test]
    fn repeated_keys_fold_in_order_of_first_appearance() {
        let keys: Vec<&[u8]> = vec![b"b", b"a", b"b", b"c", b"a"];
        let deltas = [1, 10, 2, 20, i64::MAX, 30, 4, 40, 1, 1];
        let folded = Folded::new(&keys, &deltas, 2);
        assert_eq!(folded.keys, vec![&b"b"[..], b"a", b"c"]);
        assert_eq!(folded.lanes(0), &[i64::MIN, 40]); // 1 + i64::MAX wraps
        assert_eq!(folded.lanes(1), &[3, 21]);
        assert_eq!(folded.lanes(2), &[4, 40]);
        assert!(Folded::new(&[], &[], 3).keys.is_empty());
    }

    proptest! {
        #[test]
        fn folding_then_adding_is_adding_one_by_one(
            rows in prop::collection::vec((0u8..4, any::<i64>(), any::<i64>()), 0..40),
        ) {
            let names: Vec<[u8; 1]> = rows.iter().map(|r| [r.0]).collect();
            let keys: Vec<&[u8]> = names.iter().map(|n| &n[..]).collect();
            let deltas: Vec<i64> = rows.iter().flat_map(|r| [r.1, r.2]).collect();
            let folded = Folded::new(&keys, &deltas, 2);
            let mut one_by_one: HashMap<&[u8], Vec<u8>> = HashMap::new();
            for (key, row) in keys.iter().zip(deltas.chunks_exact(2)) {
                let next = add(one_by_one.get(key).map(Vec::as_slice), row);
                one_by_one.insert(key, next);
            }
            prop_assert_eq!(folded.keys.len(), one_by_one.len());
            for (i, key) in folded.keys.iter().enumerate() {
                prop_assert_eq!(&add(None, folded.lanes(i)), &one_by_one[key]);
            }
        }
    }
}
