//! Keys: the longest accepted, and the key an HTTP middleware uses for a raw value.

use std::ffi::c_char;

use crate::error::{key_str, lease_status, write_str};

/// Longest key accepted by `lease_acquire` and friends, in bytes.
pub const LEASE_MAX_KEY_LEN: usize = 512;
const _: () = assert!(LEASE_MAX_KEY_LEN == quotalease::MAX_KEY_LEN);

/// The limiter key an HTTP middleware should use for a raw value (a header,
/// a client address, a user id), written NUL-terminated into `buf`: the raw
/// value itself when it is at most `LEASE_MAX_KEY_LEN` bytes, else "sha256:"
/// followed by the 64 lowercase hex digits of its SHA-256. Every binding's
/// middleware uses this rule, so an over-long header never turns a request
/// into an error, and equal raw values share one bucket in every process and
/// language.
///
/// `key` is `key_len` bytes of UTF-8 (no NUL needed; NULL with length 0 is
/// the empty key, written back as ""). The result is `*needed - 1` bytes.
/// Buffer rules as for `lease_metrics_prometheus`: `*needed` (when `needed`
/// is not NULL) receives the size needed, NUL included; a smaller `cap`
/// gets "" (if `cap > 0`) and `LEASE_ERR_BUFFER_TOO_SMALL`.
/// `LEASE_MAX_KEY_LEN + 1` bytes always suffice.
///
/// Errors: `LEASE_ERR_NULL` (key with `key_len > 0`, or buf with
/// `cap > 0`), `LEASE_ERR_UTF8`, `LEASE_ERR_BUFFER_TOO_SMALL`,
/// `LEASE_ERR_INVALID_KEY` (a `key_len` above `PTRDIFF_MAX`, which no
/// buffer can have; refused before the key is read).
///
/// # Safety
/// `key` is NULL or has `key_len` readable bytes; `buf` is NULL or has `cap`
/// writable bytes; `needed` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn lease_http_key(
    key: *const u8,
    key_len: usize,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> lease_status {
    ffi_boundary! {
        const F: &str = "lease_http_key";
        let raw = match unsafe { key_str(F, key, key_len) } {
            Ok(k) => k,
            Err(st) => return st,
        };
        unsafe { write_str(F, &quotalease::http_key(raw), buf, cap, needed) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::lease_status::*;
    use std::ffi::CStr;

    fn key_of(raw: &[u8]) -> (lease_status, String, usize) {
        let mut buf = [0 as c_char; LEASE_MAX_KEY_LEN + 1];
        let mut needed = 0;
        let s = unsafe { lease_http_key(raw.as_ptr(), raw.len(), buf.as_mut_ptr(), buf.len(), &mut needed) };
        let k = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
        (s, k, needed)
    }

    #[test]
    fn short_keys_stay_and_long_ones_are_hashed() {
        assert_eq!(key_of(b"user:42"), (LEASE_OK, "user:42".into(), 8));
        let exact = "k".repeat(LEASE_MAX_KEY_LEN);
        assert_eq!(
            key_of(exact.as_bytes()),
            (LEASE_OK, exact.clone(), LEASE_MAX_KEY_LEN + 1)
        );
        let (s, k, n) = key_of("k".repeat(LEASE_MAX_KEY_LEN + 1).as_bytes());
        assert_eq!((s, n, k.len()), (LEASE_OK, 72, 71));
        assert!(k.starts_with("sha256:"), "{k}");
        assert_eq!(key_of(b"\xff").0, LEASE_ERR_UTF8);
        let mut needed = 0;
        let s = unsafe { lease_http_key(std::ptr::null(), 3, std::ptr::null_mut(), 0, &mut needed) };
        assert_eq!(s, LEASE_ERR_NULL);
    }
}
