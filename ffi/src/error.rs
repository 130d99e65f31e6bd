//! Status codes, the thread-local last error, and the panic boundary's fallback values.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::sync::OnceLock;

use quotalease::{Error, ErrorKind};

/// The result of every liblease function. The numbers are fixed forever:
/// new codes get new numbers, and a retired one is never reused.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum lease_status {
    /// Success.
    LEASE_OK = 0,
    /// A required pointer argument was NULL (or a key pointer was NULL with a
    /// non-zero length).
    LEASE_ERR_NULL = 1,
    /// An invalid configuration value (the message names the option), or an
    /// invalid `limit` / `window_ms` given to `lease_set_limit`.
    LEASE_ERR_CONFIG = 2,
    /// The key is empty or longer than 512 bytes.
    LEASE_ERR_INVALID_KEY = 3,
    /// The cost is 0 or larger than the key's limit.
    LEASE_ERR_INVALID_COST = 4,
    /// The limiter was closed with `lease_close`.
    LEASE_ERR_CLOSED = 5,
    /// The backend failed a call that must reach it (`lease_flush`,
    /// `lease_close`, `lease_limiter_check`). `lease_acquire` never returns
    /// this: it applies the failure policy instead.
    LEASE_ERR_BACKEND = 6,
    /// A key or string argument is not valid UTF-8.
    LEASE_ERR_UTF8 = 7,
    /// The caller's buffer is too small; the size needed was written to `*needed`.
    LEASE_ERR_BUFFER_TOO_SMALL = 8,
    /// A bug inside liblease was caught at the boundary (please report it
    /// with the message from `lease_last_error()`).
    LEASE_ERR_PANIC = 9,
    /// The backend is reachable but refuses this configuration (wrong or
    /// missing password, a database index it lacks, a cluster URL at a
    /// standalone server, a port that does not speak Redis, an ACL user
    /// without the scripts' permissions): a configuration error, not an
    /// outage. `lease_acquire` (once local tokens are spent) and
    /// `lease_limiter_check` return it while the backend answers so; the
    /// message names the host (credentials removed) and what to change.
    LEASE_ERR_MISCONFIGURED = 10,
    /// `lease_reservation_settle` refused: the reservation was settled
    /// already, it was denied (nothing was reserved), or `actual` is negative;
    /// or `lease_permit_release` refused: the permit was released already,
    /// or it was denied (no permit was taken).
    LEASE_ERR_RESERVATION = 11,
}

use lease_status::*;

impl lease_status {
    pub(crate) fn of(e: &Error) -> lease_status {
        Self::of_kind(e.kind())
    }

    /// The status that reports errors of `kind`.
    fn of_kind(kind: ErrorKind) -> lease_status {
        match kind {
            ErrorKind::Config => LEASE_ERR_CONFIG,
            ErrorKind::InvalidKey => LEASE_ERR_INVALID_KEY,
            ErrorKind::InvalidCost => LEASE_ERR_INVALID_COST,
            ErrorKind::Closed => LEASE_ERR_CLOSED,
            ErrorKind::Backend => LEASE_ERR_BACKEND,
            ErrorKind::Misconfigured => LEASE_ERR_MISCONFIGURED,
            ErrorKind::Reservation => LEASE_ERR_RESERVATION,
        }
    }
}

/// The core's name of every error kind, NUL-terminated, in `ErrorKind::ALL` order.
fn kind_names() -> &'static [CString] {
    static NAMES: OnceLock<Vec<CString>> = OnceLock::new();
    NAMES.get_or_init(|| {
        ErrorKind::ALL
            .iter()
            .map(|k| CString::new(k.as_str()).unwrap_or_default())
            .collect()
    })
}

/// The name, as in every binding and in the conformance vectors, of the
/// error kind a status reports: "config" (`LEASE_ERR_CONFIG`),
/// "invalid_key", "invalid_cost", "closed", "backend", "misconfigured"
/// (`LEASE_ERR_MISCONFIGURED`) or "reservation" (`LEASE_ERR_RESERVATION`). "" for a status
/// with no kind of its own: `LEASE_OK`, `LEASE_ERR_NULL`,
/// `LEASE_ERR_BUFFER_TOO_SMALL`, `LEASE_ERR_PANIC`, `LEASE_ERR_UTF8` (an
/// invalid key when it was about a key, a configuration error when it was
/// about an option) and any unknown number. Takes the status as an integer
/// (pass a `lease_status`). Static storage: never free it.
#[no_mangle]
pub extern "C" fn lease_error_kind_name(status: u32) -> *const c_char {
    ffi_boundary! {
        match ErrorKind::ALL.iter().position(|k| lease_status::of_kind(*k) as u32 == status) {
            Some(i) => kind_names()[i].as_ptr(),
            None => c"".as_ptr(),
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Record `message` as this thread's last error and return `status`.
#[cold]
pub(crate) fn fail(status: lease_status, message: impl Into<String>) -> lease_status {
    let mut m: String = message.into();
    if m.contains('\0') {
        m = m.replace('\0', "\\0");
    }
    let c = CString::new(m).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = c);
    status
}

/// Record a core error, prefixed with the function's name.
#[cold]
pub(crate) fn fail_with(fname: &str, e: &Error) -> lease_status {
    fail(lease_status::of(e), format!("{fname}: {e}"))
}

/// `LEASE_OK`, or the core error recorded as `fail_with` does.
pub(crate) fn status(fname: &str, r: Result<(), Error>) -> lease_status {
    match r {
        Ok(()) => LEASE_OK,
        Err(e) => fail_with(fname, &e),
    }
}

#[cold]
pub(crate) fn null_arg(fname: &str, arg: &str) -> lease_status {
    fail(LEASE_ERR_NULL, format!("{fname}: `{arg}` is NULL"))
}

/// The message of the last failure on the calling thread: what went wrong
/// and what to fix, e.g. "lease_limiter_new: invalid configuration: `limit`
/// must be at least 1: every limiter needs a limit (tokens per window)".
///
/// Never NULL: "" when nothing has failed on this thread yet. Successful calls
/// leave it unchanged. The string belongs to liblease; it stays valid until
/// the calling thread makes its next liblease call (copy it if you need it
/// longer). Each thread has its own.
#[no_mangle]
pub extern "C" fn lease_last_error() -> *const c_char {
    ffi_boundary! {
        LAST_ERROR
            .try_with(|slot| slot.borrow().as_ptr())
            .unwrap_or(c"".as_ptr())
    }
}

/// What an exported function returns when its body panicked.
pub(crate) trait Panicked {
    fn panicked(payload: Box<dyn std::any::Any + Send>) -> Self;
}

fn record_panic(payload: Box<dyn std::any::Any + Send>) {
    let what = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string());
    fail(
        LEASE_ERR_PANIC,
        format!("internal error (a bug in liblease, please report it): {what}"),
    );
}

impl Panicked for lease_status {
    fn panicked(payload: Box<dyn std::any::Any + Send>) -> Self {
        record_panic(payload);
        LEASE_ERR_PANIC
    }
}

impl Panicked for () {
    fn panicked(payload: Box<dyn std::any::Any + Send>) -> Self {
        record_panic(payload);
    }
}

impl Panicked for *const c_char {
    fn panicked(payload: Box<dyn std::any::Any + Send>) -> Self {
        record_panic(payload);
        c"".as_ptr()
    }
}

/// Write `s` and a terminating NUL into the caller's buffer.
///
/// `*needed` (when `needed` is not NULL) always receives `strlen(s) + 1`. A
/// buffer smaller than that gets "" (when `cap > 0`) and the call returns
/// `LEASE_ERR_BUFFER_TOO_SMALL`; `buf = NULL, cap = 0` is the way to ask for
/// the size.
///
/// # Safety
/// `buf` is NULL or points to `cap` writable bytes; `needed` is NULL or valid.
pub(crate) unsafe fn write_str(fname: &str, s: &str, buf: *mut c_char, cap: usize, needed: *mut usize) -> lease_status {
    let need = s.len() + 1;
    if let Some(n) = unsafe { needed.as_mut() } {
        *n = need;
    }
    if buf.is_null() && cap > 0 {
        return null_arg(fname, "buf");
    }
    if cap < need {
        if cap > 0 {
            unsafe { *buf = 0 };
        }
        return fail(
            LEASE_ERR_BUFFER_TOO_SMALL,
            format!("{fname}: the buffer holds {cap} bytes but {need} are needed (the size was written to *needed)"),
        );
    }
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        *buf.add(s.len()) = 0;
    }
    LEASE_OK
}

/// Borrow a NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `p` is NULL or a valid NUL-terminated string.
pub(crate) unsafe fn c_str<'a>(fname: &str, arg: &str, p: *const c_char) -> Result<&'a str, lease_status> {
    if p.is_null() {
        return Err(null_arg(fname, arg));
    }
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_str()
        .map_err(|e| fail(LEASE_ERR_UTF8, format!("{fname}: `{arg}` is not valid UTF-8 ({e})")))
}

/// Whether `b` is ASCII, branch-light for keys up to 16 bytes (overlapping
/// word loads instead of a byte loop).
#[inline(always)]
fn short_ascii(b: &[u8]) -> bool {
    let n = b.len();
    if n >= 8 {
        if n > 16 {
            return b.is_ascii();
        }
        let lo = u64::from_le_bytes(b[..8].try_into().unwrap_or_default());
        let hi = u64::from_le_bytes(b[n - 8..].try_into().unwrap_or_default());
        return (lo | hi) & 0x8080_8080_8080_8080 == 0;
    }
    if n >= 4 {
        let lo = u32::from_le_bytes(b[..4].try_into().unwrap_or_default());
        let hi = u32::from_le_bytes(b[n - 4..].try_into().unwrap_or_default());
        return (lo | hi) & 0x8080_8080 == 0;
    }
    b.iter().fold(0u8, |acc, &x| acc | x) < 0x80
}

/// Borrow a key given as pointer + length.
///
/// # Safety
/// `key` is NULL or points to `len` readable bytes.
#[inline(always)]
pub(crate) unsafe fn key_str<'a>(fname: &str, key: *const u8, len: usize) -> Result<&'a str, lease_status> {
    if !key.is_null() && len <= isize::MAX as usize {
        let bytes = unsafe { std::slice::from_raw_parts(key, len) };
        // Most keys are short ASCII ("user:42"): checking that takes a few
        // instructions, where the general UTF-8 validator takes about a hundred.
        if short_ascii(bytes) {
            // SAFETY: ASCII is valid UTF-8.
            return Ok(unsafe { std::str::from_utf8_unchecked(bytes) });
        }
    }
    unsafe { key_str_slow(fname, key, len) }
}

/// [`key_str`] for NULL keys and non-ASCII bytes.
#[cold]
#[inline(never)]
unsafe fn key_str_slow<'a>(fname: &str, key: *const u8, len: usize) -> Result<&'a str, lease_status> {
    if key.is_null() {
        if len == 0 {
            return Ok("");
        }
        return Err(null_arg(fname, "key"));
    }
    if len > isize::MAX as usize {
        return Err(fail(
            LEASE_ERR_INVALID_KEY,
            format!("{fname}: key_len {len} is not a length"),
        ));
    }
    let bytes = unsafe { std::slice::from_raw_parts(key, len) };
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(s),
        Err(e) => Err(fail(
            LEASE_ERR_UTF8,
            format!("{fname}: the key is not valid UTF-8 ({e}); keys are UTF-8 byte strings"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        unsafe { CStr::from_ptr(lease_last_error()) }
            .to_str()
            .unwrap()
            .to_string()
    }

    /// A panic inside an exported body becomes LEASE_ERR_PANIC (or the
    /// return type's fallback) with a message, never an unwind into C.
    #[test]
    fn the_boundary_turns_panics_into_status_codes() {
        let status: lease_status = ffi_boundary! {
            if last().is_empty() {
                panic!("boom");
            }
            LEASE_OK
        };
        assert_eq!(status, LEASE_ERR_PANIC);
        assert!(last().contains("boom"), "{}", last());
        let p: *const c_char = ffi_boundary! { panic!("{}", String::from("owned message")) };
        assert_eq!(unsafe { CStr::from_ptr(p) }.to_bytes(), b"");
        assert!(last().contains("owned message"));
        let () = ffi_boundary! { panic!("in a void function") };
        assert!(last().contains("void function"));
    }

    #[test]
    fn error_kind_names_are_the_cores() {
        for k in ErrorKind::ALL {
            let st = lease_status::of_kind(k) as u32;
            assert_eq!(
                unsafe { CStr::from_ptr(lease_error_kind_name(st)) }.to_str().unwrap(),
                k.as_str()
            );
        }
        for st in [
            LEASE_OK,
            LEASE_ERR_NULL,
            LEASE_ERR_UTF8,
            LEASE_ERR_BUFFER_TOO_SMALL,
            LEASE_ERR_PANIC,
        ] {
            assert_eq!(
                unsafe { CStr::from_ptr(lease_error_kind_name(st as u32)) }.to_bytes(),
                b""
            );
        }
        assert_eq!(
            unsafe { CStr::from_ptr(lease_error_kind_name(u32::MAX)) }.to_bytes(),
            b""
        );
    }

    #[test]
    fn short_ascii_agrees_with_is_ascii() {
        for len in 0..40 {
            for pos in 0..len {
                let mut v = vec![b'a'; len];
                assert!(short_ascii(&v), "len {len}");
                v[pos] = 0xC3;
                assert!(!short_ascii(&v), "len {len} pos {pos}");
            }
        }
        assert!(short_ascii(b""));
    }

    #[test]
    fn buffers_report_the_size_they_need() {
        let mut buf = [b'x' as c_char; 4];
        let mut needed = 0usize;
        let s = unsafe { write_str("f", "abcd", buf.as_mut_ptr(), buf.len(), &mut needed) };
        assert_eq!((s, needed, buf[0]), (LEASE_ERR_BUFFER_TOO_SMALL, 5, 0));
        let mut big = [0 as c_char; 5];
        let s = unsafe { write_str("f", "abcd", big.as_mut_ptr(), big.len(), std::ptr::null_mut()) };
        assert_eq!(s, LEASE_OK);
        assert_eq!(unsafe { CStr::from_ptr(big.as_ptr()) }.to_bytes(), b"abcd");
        let s = unsafe { write_str("f", "abcd", std::ptr::null_mut(), 0, &mut needed) };
        assert_eq!((s, needed), (LEASE_ERR_BUFFER_TOO_SMALL, 5));
        let s = unsafe { write_str("f", "abcd", std::ptr::null_mut(), 9, &mut needed) };
        assert_eq!(s, LEASE_ERR_NULL);
        assert_eq!(fail(LEASE_ERR_CONFIG, "a\0b"), LEASE_ERR_CONFIG);
        assert_eq!(last(), "a\\0b");
    }
}
