//! FoundationDB's batch operations, one C call per key with no interpreter between them.
//!
//! Nothing here links `libfdb_c`: the package must load and run without it (on SQLite).
//! The process that uses FoundationDB has already loaded the library and selected its API
//! version through the official binding, so the caller hands over the addresses of the C
//! functions ([`FdbFunctions`]) and a transaction's pointer, and [`FdbTransaction`] issues
//! the calls. The C API is thread-safe: callers run these loops without holding any
//! interpreter lock.
//!
//! Every future is destroyed on every path (also after an error, [`Future`]'s `Drop`); an
//! error of any future comes back as its FoundationDB error code ([`Error::Fdb`]) for the
//! caller to translate as the binding's own errors are.

use std::ffi::c_int;
use std::ptr;

use crate::error::{Error, Result};
use crate::lanes;

/// `FDB_MUTATION_TYPE_ADD` (fdb_c_options.g.h): little-endian integer addition.
const MUTATION_ADD: c_int = 2;

/// An opaque `FDBTransaction`.
#[repr(C)]
pub struct RawTransaction {
    _opaque: [u8; 0],
}

/// An opaque `FDBFuture`.
#[repr(C)]
struct RawFuture {
    _opaque: [u8; 0],
}

type GetFn = unsafe extern "C" fn(*mut RawTransaction, *const u8, c_int, c_int) -> *mut RawFuture;
type SetFn = unsafe extern "C" fn(*mut RawTransaction, *const u8, c_int, *const u8, c_int);
type AtomicOpFn =
    unsafe extern "C" fn(*mut RawTransaction, *const u8, c_int, *const u8, c_int, c_int);
type BlockFn = unsafe extern "C" fn(*mut RawFuture) -> c_int;
type GetValueFn =
    unsafe extern "C" fn(*mut RawFuture, *mut c_int, *mut *const u8, *mut c_int) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut RawFuture);

/// The addresses of the `libfdb_c` functions the batch operations call, as the loaded
/// library exports them (API version 730's signatures, `fdb_c.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdbAddresses {
    /// `fdb_transaction_get`.
    pub transaction_get: usize,
    /// `fdb_transaction_set`.
    pub transaction_set: usize,
    /// `fdb_transaction_atomic_op`.
    pub transaction_atomic_op: usize,
    /// `fdb_future_block_until_ready`.
    pub future_block_until_ready: usize,
    /// `fdb_future_get_value`.
    pub future_get_value: usize,
    /// `fdb_future_destroy`.
    pub future_destroy: usize,
}

/// The `libfdb_c` functions the batch operations call.
#[derive(Debug, Clone, Copy)]
pub struct FdbFunctions {
    get: GetFn,
    set: SetFn,
    atomic_op: AtomicOpFn,
    block_until_ready: BlockFn,
    get_value: GetValueFn,
    destroy: DestroyFn,
}

impl FdbFunctions {
    /// The functions at `addresses`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if an address is null.
    ///
    /// # Safety
    ///
    /// Each address must be that of the named function of a `libfdb_c` loaded in this
    /// process with API version 730 or later selected, and the library must stay loaded
    /// for as long as the result is used.
    pub unsafe fn new(addresses: FdbAddresses) -> Result<Self> {
        let all = [
            ("fdb_transaction_get", addresses.transaction_get),
            ("fdb_transaction_set", addresses.transaction_set),
            ("fdb_transaction_atomic_op", addresses.transaction_atomic_op),
            (
                "fdb_future_block_until_ready",
                addresses.future_block_until_ready,
            ),
            ("fdb_future_get_value", addresses.future_get_value),
            ("fdb_future_destroy", addresses.future_destroy),
        ];
        if let Some((name, _)) = all.iter().find(|(_, address)| *address == 0) {
            return Err(Error::InvalidArgument(format!(
                "the address of {name} is null; pass the functions of the loaded libfdb_c"
            )));
        }
        // SAFETY: the caller guarantees each address is the named C function, whose
        // signature the types above spell out.
        unsafe {
            Ok(Self {
                get: std::mem::transmute::<usize, GetFn>(addresses.transaction_get),
                set: std::mem::transmute::<usize, SetFn>(addresses.transaction_set),
                atomic_op: std::mem::transmute::<usize, AtomicOpFn>(
                    addresses.transaction_atomic_op,
                ),
                block_until_ready: std::mem::transmute::<usize, BlockFn>(
                    addresses.future_block_until_ready,
                ),
                get_value: std::mem::transmute::<usize, GetValueFn>(addresses.future_get_value),
                destroy: std::mem::transmute::<usize, DestroyFn>(addresses.future_destroy),
            })
        }
    }
}

/// A future, destroyed when dropped.
struct Future<'f> {
    raw: *mut RawFuture,
    functions: &'f FdbFunctions,
}

impl Future<'_> {
    /// Waits for the value read; `None` when the key is absent. The slice lives as long
    /// as the future.
    fn value(&self) -> Result<Option<&[u8]>> {
        // SAFETY: `raw` is a live future of a get (destroyed only by `drop`); the out
        // pointers are valid locals. The value lives until the future is destroyed, and
        // the returned slice borrows `self`, so it cannot outlive it.
        unsafe {
            check((self.functions.block_until_ready)(self.raw))?;
            let mut present: c_int = 0;
            let mut value: *const u8 = ptr::null();
            let mut length: c_int = 0;
            check((self.functions.get_value)(
                self.raw,
                &mut present,
                &mut value,
                &mut length,
            ))?;
            if present == 0 {
                return Ok(None);
            }
            let length = usize::try_from(length).unwrap_or_default();
            if length == 0 {
                return Ok(Some(&[]));
            }
            Ok(Some(std::slice::from_raw_parts(value, length)))
        }
    }
}

impl Drop for Future<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` is a live future, destroyed exactly once, here.
        unsafe { (self.functions.destroy)(self.raw) }
    }
}

fn check(code: c_int) -> Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(Error::Fdb { code })
    }
}

fn length(bytes: &[u8]) -> Result<c_int> {
    c_int::try_from(bytes.len()).map_err(|_| {
        Error::InvalidArgument(format!(
            "a key or value of {} bytes is beyond what FoundationDB's C API takes",
            bytes.len()
        ))
    })
}

/// A FoundationDB transaction to issue batch operations on.
#[derive(Debug)]
pub struct FdbTransaction {
    functions: FdbFunctions,
    raw: *mut RawTransaction,
}

// SAFETY: libfdb_c's transactions may be used from any thread; the caller keeps the
// transaction to one thread at a time (`FdbTransaction::new`).
unsafe impl Send for FdbTransaction {}

impl FdbTransaction {
    /// The transaction at `raw`.
    ///
    /// # Safety
    ///
    /// `raw` must be a live `FDBTransaction*` of the library `functions` come from; it
    /// must outlive the result, and nothing else may use it while a method runs.
    pub unsafe fn new(functions: FdbFunctions, raw: *mut RawTransaction) -> Self {
        Self { functions, raw }
    }

    fn get(&self, key: &[u8], snapshot: bool) -> Result<Future<'_>> {
        let key_length = length(key)?;
        // SAFETY: `raw` is live (see `new`); `key` is valid for the call.
        let raw = unsafe {
            (self.functions.get)(self.raw, key.as_ptr(), key_length, c_int::from(snapshot))
        };
        if raw.is_null() {
            return Err(Error::InvalidArgument(
                "libfdb_c returned no future for a read".to_string(),
            ));
        }
        Ok(Future {
            raw,
            functions: &self.functions,
        })
    }

    fn set(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let (key_length, value_length) = (length(key)?, length(value)?);
        // SAFETY: `raw` is live; the buffers are valid for the call, which copies them.
        unsafe {
            (self.functions.set)(
                self.raw,
                key.as_ptr(),
                key_length,
                value.as_ptr(),
                value_length,
            );
        }
        Ok(())
    }

    /// Writes `values[i]` at `keys[i]` for every i.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] unless there is one value per key.
    pub fn set_many<'a>(
        &self,
        keys: impl ExactSizeIterator<Item = &'a [u8]>,
        values: impl ExactSizeIterator<Item = &'a [u8]>,
    ) -> Result<()> {
        same_length("values", keys.len(), values.len())?;
        for (key, value) in keys.zip(values) {
            self.set(key, value)?;
        }
        Ok(())
    }

    /// Atomically adds `deltas[i]` (an 8-byte little-endian int64) to `keys[i]` for every
    /// i: one FoundationDB `ADD` each, which never reads and so never conflicts.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] unless `deltas` holds 8 bytes per key.
    pub fn add_many<'a>(
        &self,
        keys: impl ExactSizeIterator<Item = &'a [u8]>,
        deltas: &[u8],
    ) -> Result<()> {
        whole_rows(keys.len(), deltas.len(), 8, "bytes of int64 deltas")?;
        for (key, delta) in keys.zip(deltas.chunks_exact(8)) {
            self.add(key, delta)?;
        }
        Ok(())
    }

    /// One atomic `ADD` of `operand` (a little-endian integer) to `key`.
    fn add(&self, key: &[u8], operand: &[u8]) -> Result<()> {
        let (key_length, operand_length) = (length(key)?, length(operand)?);
        // SAFETY: `raw` is live; the buffers are valid for the call, which copies them.
        unsafe {
            (self.functions.atomic_op)(
                self.raw,
                key.as_ptr(),
                key_length,
                operand.as_ptr(),
                operand_length,
                MUTATION_ADD,
            );
        }
        Ok(())
    }

    /// Adds `deltas` (`width` int64 lanes per key, row after row) to `keys` lane by lane:
    /// one FoundationDB `ADD` per key in the slot layout of [`lanes`], which never reads
    /// and so never conflicts. Repeated keys are added as often as they come.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] unless `deltas` holds `width` (at least one) lanes per key.
    pub fn add_lanes(&self, keys: &[&[u8]], deltas: &[i64], width: usize) -> Result<()> {
        if width == 0 {
            return Err(Error::InvalidArgument(
                "counter lanes need a width of at least one".to_string(),
            ));
        }
        whole_rows(keys.len(), deltas.len(), width, "lanes")?;
        let mut operand = Vec::with_capacity(lanes::SLOT_BYTES * width + 1);
        for (key, row) in keys.iter().zip(deltas.chunks_exact(width)) {
            operand.clear();
            lanes::push_operand(row, &mut operand);
            self.add(key, &operand)?;
        }
        Ok(())
    }

    /// Reads every one of `keys` (all reads in flight at once) and hands each value, or
    /// `None` for an absent key, to `each` in order; with `snapshot` the reads add no read
    /// conflicts.
    ///
    /// # Errors
    ///
    /// [`Error::Fdb`] with the code of the first read that failed.
    pub fn get_many<'a>(
        &self,
        keys: impl Iterator<Item = &'a [u8]>,
        snapshot: bool,
        mut each: impl FnMut(Option<&[u8]>),
    ) -> Result<()> {
        let futures = keys
            .map(|key| self.get(key, snapshot))
            .collect::<Result<Vec<_>>>()?;
        for future in &futures {
            each(future.value()?);
        }
        Ok(())
    }
}

fn same_length(what: &str, keys: usize, other: usize) -> Result<()> {
    if keys == other {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "a batch of {keys} keys came with {other} {what}; pass one per key"
        )))
    }
}

fn whole_rows(keys: usize, items: usize, per_key: usize, what: &str) -> Result<()> {
    if Some(items) == keys.checked_mul(per_key) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "a batch of {keys} keys came with {items} {what}; pass {per_key} per key"
        )))
    }
}

/// The wrapper's own discipline (every future destroyed, one call per key, lanes
/// never read), which a real `libfdb_c` cannot show: checked against stand-in C functions that
/// count futures. What FoundationDB does with the calls is tested on a real cluster by
/// the Python store contract suite.
#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    const TIMED_OUT: c_int = 1031;

    struct StandIn {
        value: Option<Vec<u8>>,
        error: c_int,
    }

    #[derive(Default)]
    struct Calls {
        created: usize,
        destroyed: usize,
        sets: Vec<(Vec<u8>, Vec<u8>)>,
        adds: Vec<(Vec<u8>, Vec<u8>)>,
    }

    thread_local! {
        static CALLS: RefCell<Calls> = RefCell::new(Calls::default());
    }

    unsafe fn bytes<'a>(data: *const u8, length: c_int) -> &'a [u8] {
        unsafe { std::slice::from_raw_parts(data, length as usize) }
    }

    /// Keys starting with `fail` time out; `absent` is absent; others hold their own bytes.
    unsafe extern "C" fn get(
        _: *mut RawTransaction,
        k: *const u8,
        n: c_int,
        _: c_int,
    ) -> *mut RawFuture {
        let key = unsafe { bytes(k, n) };
        let future = StandIn {
            value: (key != b"absent").then(|| key.to_vec()),
            error: if key.starts_with(b"fail") {
                TIMED_OUT
            } else {
                0
            },
        };
        CALLS.with(|c| c.borrow_mut().created += 1);
        Box::into_raw(Box::new(future)).cast()
    }

    unsafe extern "C" fn set(
        _: *mut RawTransaction,
        k: *const u8,
        n: c_int,
        v: *const u8,
        m: c_int,
    ) {
        let write = unsafe { (bytes(k, n).to_vec(), bytes(v, m).to_vec()) };
        CALLS.with(|c| c.borrow_mut().sets.push(write));
    }

    unsafe extern "C" fn atomic_op(
        _: *mut RawTransaction,
        k: *const u8,
        n: c_int,
        p: *const u8,
        m: c_int,
        operation: c_int,
    ) {
        assert_eq!(operation, MUTATION_ADD);
        let write = unsafe { (bytes(k, n).to_vec(), bytes(p, m).to_vec()) };
        CALLS.with(|c| c.borrow_mut().adds.push(write));
    }

    unsafe extern "C" fn block(_: *mut RawFuture) -> c_int {
        0
    }

    unsafe extern "C" fn get_value(
        f: *mut RawFuture,
        present: *mut c_int,
        value: *mut *const u8,
        length: *mut c_int,
    ) -> c_int {
        let future = unsafe { &*f.cast::<StandIn>() };
        if future.error != 0 {
            return future.error;
        }
        let found = future.value.as_deref();
        unsafe {
            *present = c_int::from(found.is_some());
            *value = found.map_or(ptr::null(), <[u8]>::as_ptr);
            *length = found.map_or(0, |v| v.len() as c_int);
        }
        0
    }

    unsafe extern "C" fn destroy(f: *mut RawFuture) {
        drop(unsafe { Box::from_raw(f.cast::<StandIn>()) });
        CALLS.with(|c| c.borrow_mut().destroyed += 1);
    }

    fn transaction() -> FdbTransaction {
        let addresses = FdbAddresses {
            transaction_get: get as *const () as usize,
            transaction_set: set as *const () as usize,
            transaction_atomic_op: atomic_op as *const () as usize,
            future_block_until_ready: block as *const () as usize,
            future_get_value: get_value as *const () as usize,
            future_destroy: destroy as *const () as usize,
        };
        CALLS.with(|c| *c.borrow_mut() = Calls::default());
        // SAFETY: the stand-ins have the C functions' signatures; the transaction pointer
        // is never dereferenced by them.
        unsafe { FdbTransaction::new(FdbFunctions::new(addresses).unwrap(), ptr::dangling_mut()) }
    }

    fn calls<T>(f: impl FnOnce(&Calls) -> T) -> T {
        CALLS.with(|c| f(&c.borrow()))
    }

    #[test]
    fn a_failed_read_destroys_every_future() {
        let tr = transaction();
        let keys: Vec<&[u8]> = vec![b"one", b"fail", b"two"];
        let mut seen = 0;
        let result = tr.get_many(keys.iter().copied(), true, |_| seen += 1);
        assert!(matches!(result, Err(Error::Fdb { code: TIMED_OUT })));
        assert_eq!(seen, 1);
        assert_eq!(calls(|c| (c.created, c.destroyed)), (3, 3));
    }

    #[test]
    fn lanes_are_one_add_a_key_and_no_read() {
        let tr = transaction();
        let keys: Vec<&[u8]> = vec![b"a", b"b", b"a"];
        tr.add_lanes(&keys, &[1, -1, 2, 3, 4, -4], 2).unwrap();
        let adds = calls(|c| {
            assert_eq!((c.created, c.sets.len()), (0, 0));
            c.adds.clone()
        });
        let operand = |deltas: &[i64]| {
            let mut out = Vec::new();
            lanes::push_operand(deltas, &mut out);
            out
        };
        let expected = [
            (b"a".to_vec(), operand(&[1, -1])),
            (b"b".to_vec(), operand(&[2, 3])),
            (b"a".to_vec(), operand(&[4, -4])),
        ];
        assert_eq!(adds, expected);

        let mut values = Vec::new();
        tr.get_many([&b"absent"[..], b"12345678"].into_iter(), false, |v| {
            values.push(v.map(<[u8]>::to_vec))
        })
        .unwrap();
        assert_eq!(values, vec![None, Some(b"12345678".to_vec())]);
        assert_eq!(calls(|c| (c.created, c.destroyed)), (2, 2));
    }

    #[test]
    fn counters_are_one_add_each_and_batches_are_checked() {
        let tr = transaction();
        let keys: Vec<&[u8]> = vec![b"a", b"b"];
        let deltas: Vec<u8> = [7i64, -7].iter().flat_map(|d| d.to_le_bytes()).collect();
        tr.add_many(keys.iter().copied(), &deltas).unwrap();
        let adds = calls(|c| c.adds.clone());
        assert_eq!(
            adds,
            vec![
                (b"a".to_vec(), deltas[..8].to_vec()),
                (b"b".to_vec(), deltas[8..].to_vec())
            ]
        );
        assert!(tr.add_many(keys.iter().copied(), &deltas[..12]).is_err());
        assert!(tr.add_lanes(&keys, &[1, 2, 3], 2).is_err());
        assert!(tr.add_lanes(&keys, &[], 0).is_err());
        assert!(tr
            .set_many(keys.iter().copied(), [&b"v"[..]].into_iter())
            .is_err());
        assert_eq!(
            calls(|c| (c.adds.len(), c.sets.len(), c.created)),
            (2, 0, 0)
        );
    }

    #[test]
    fn a_null_address_is_refused() {
        let addresses = FdbAddresses {
            transaction_get: 0,
            transaction_set: 1,
            transaction_atomic_op: 1,
            future_block_until_ready: 1,
            future_get_value: 1,
            future_destroy: 1,
        };
        // SAFETY: refused before any address is used.
        let refused = unsafe { FdbFunctions::new(addresses) };
        assert!(
            matches!(refused, Err(Error::InvalidArgument(m)) if m.contains("fdb_transaction_get"))
        );
    }
}
