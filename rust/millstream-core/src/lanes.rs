//! Counter lanes as FoundationDB stores them: several int64 counters of one key added by
//! one atomic `ADD`, with no read.
//!
//! FoundationDB's `ADD` adds a whole value as one little-endian integer, so a carry out of
//! one int64 would run into the next. Each lane therefore takes a *slot* of 16 bytes: the
//! int64 (two's complement), then 8 bytes that take its carries. A lane's delta goes into
//! the low half with a zero high half; its sum wraps in the low half exactly as an int64
//! add wraps, and the high half counts the carries, at most one per add, so it reaches the
//! next slot only after 2^64 adds. One byte follows the slots: a value of `16 * lanes + 1`
//! bytes is odd, and so never mistaken for plain int64s (8 bytes each); it stays zero.
//!
//! `ADD` zero-extends a shorter stored value and cuts a longer one to the delta's length:
//! a value of another width is cut or zero-extended lane by lane, as on SQLite. Readers
//! take the low half of each slot (`millstream.state.keys.decode_int64s`).

/// Bytes a lane takes in a stored value.
pub const SLOT_BYTES: usize = 16;

/// Appends to `out` the `ADD` operand that adds `deltas` lane by lane.
pub fn push_operand(deltas: &[i64], out: &mut Vec<u8>) {
    for delta in deltas {
        out.extend_from_slice(&delta.to_le_bytes());
        out.extend_from_slice(&[0; 8]);
    }
    out.push(0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The bytes of a stored value of `lanes` counters.
    fn value_bytes(lanes: usize) -> usize {
        SLOT_BYTES * lanes + 1
    }

    /// The lanes of a stored value (`None`: absent, all zero), cut or zero-extended to `lanes`.
    fn read(value: Option<&[u8]>, lanes: usize) -> Vec<i64> {
        let value = value.unwrap_or_default();
        (0..lanes)
            .map(|i| {
                value
                    .get(i * SLOT_BYTES..i * SLOT_BYTES + 8)
                    .map_or(0, |b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            })
            .collect()
    }

    /// What `ADD` does to a stored value with `operand`, as FoundationDB documents it: the
    /// stored value zero-extended or cut to the operand's length, then both added as one
    /// little-endian integer (the last carry dropped).
    fn fdb_add(stored: Option<&[u8]>, operand: &[u8]) -> Vec<u8> {
        let mut out = stored.unwrap_or_default().to_vec();
        out.resize(operand.len(), 0);
        let mut carry = 0u16;
        for (byte, add) in out.iter_mut().zip(operand) {
            let sum = u16::from(*byte) + u16::from(*add) + carry;
            *byte = (sum & 0xff) as u8;
            carry = sum >> 8;
        }
        out
    }

    fn operand(deltas: &[i64]) -> Vec<u8> {
        let mut out = Vec::new();
        push_operand(deltas, &mut out);
        out
    }

    #[test]
    fn an_operand_is_one_slot_a_lane_and_a_byte() {
        let bytes = operand(&[1, -1]);
        assert_eq!(bytes.len(), value_bytes(2));
        assert_eq!(bytes.len() % 8, 1);
        assert_eq!(&bytes[..8], &1i64.to_le_bytes());
        assert_eq!(&bytes[8..16], &[0; 8]);
        assert_eq!(&bytes[16..24], &(-1i64).to_le_bytes());
    }

    #[test]
    fn carries_stay_in_their_slot_and_lanes_wrap_like_int64() {
        let mut value = None;
        for deltas in [[i64::MAX, -1], [1, -1], [i64::MIN, 2]] {
            value = Some(fdb_add(value.as_deref(), &operand(&deltas)));
        }
        let lanes = read(value.as_deref(), 2);
        assert_eq!(
            lanes,
            vec![i64::MAX.wrapping_add(1).wrapping_add(i64::MIN), 0]
        );
    }

    #[test]
    fn another_width_is_cut_or_zero_extended_lane_by_lane() {
        let three = fdb_add(None, &operand(&[5, 6, 7]));
        assert_eq!(
            read(Some(&fdb_add(Some(&three), &operand(&[1]))), 1),
            vec![6]
        );
        let one = fdb_add(None, &operand(&[5]));
        let widened = fdb_add(Some(&one), &operand(&[1, 1, 1]));
        assert_eq!(read(Some(&widened), 3), vec![6, 1, 1]);
        assert_eq!(read(None, 2), vec![0, 0]);
    }

    proptest! {
        #[test]
        fn any_adds_give_the_wrapping_sums(
            rounds in prop::collection::vec(prop::collection::vec(any::<i64>(), 3), 1..40)
        ) {
            let mut value: Option<Vec<u8>> = None;
            let mut expected = [0i64; 3];
            for deltas in &rounds {
                value = Some(fdb_add(value.as_deref(), &operand(deltas)));
                for (sum, delta) in expected.iter_mut().zip(deltas) {
                    *sum = sum.wrapping_add(*delta);
                }
            }
            prop_assert_eq!(read(value.as_deref(), 3), expected.to_vec());
        }
    }
}
