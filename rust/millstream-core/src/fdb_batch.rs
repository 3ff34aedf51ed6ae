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
use crate::lanes::{self, Folded};

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
        // pointers are valid locals, and the value they point to lives until the future
        // is destroyed, which the returned borrow of `self` outlives not.
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
            let key_length = length(key)?;
            // SAFETY: `raw` is live; the buffers are valid for the call, which copies them.
            unsafe {
                (self.functions.atomic_op)(
                    self.raw,
                    key.as_ptr(),
                    key_length,
                    delta.as_ptr(),
                    8,
                    MUTATION_ADD,
                );
            }
        }
        Ok(())
    }

    /// Adds `deltas` (`width` int64 lanes per key, row after row) to `keys` lane by lane
    /// ([`lanes::add`]): the deltas of a repeated key are folded first, every key is read
    /// (all reads in flight at once; they see this transaction's writes and add read
    /// conflicts), and each sum is written back. When a read fails nothing is written.
    ///
    /// # Errors
    ///
    /// [`Error::Fdb`] with the code of the first read that failed;
    /// [`Error::InvalidArgument`] unless `deltas` holds `width` lanes per key.
    pub fn add_lanes(&self, keys: &[&[u8]], deltas: &[i64], width: usize) -> Result<()> {
        if width == 0 {
            return Err(Error::InvalidArgument(
                "counter lanes need a width of at least one".to_string(),
            ));
        }
        whole_rows(keys.len(), deltas.len(), width, "lanes")?;
        let folded = Folded::new(keys, deltas, width);
        let futures = folded
            .keys
            .iter()
            .map(|key| self.get(key, false))
            .collect::<Result<Vec<_>>>()?;
        let bases = futures
            .iter()
            .map(Future::value)
            .collect::<Result<Vec<_>>>()?;
        for (i, (key, base)) in folded.keys.iter().zip(bases).enumerate() {
            self.set(key, &lanes::add(base, folded.lanes(i)))?;
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
