//! Keys: what a limiter accepts as a key, and the key an HTTP middleware
//! derives from a raw value (`http_key`). Re-exported by `config` and the
//! crate root.

use crate::error::{Error, Result};

/// Longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 512;

/// Check a key: non-empty, at most [`MAX_KEY_LEN`] bytes, and free of
/// [`crate::policy::RULE_SEPARATOR`] (U+001F), which names the buckets of a
/// key's further rules (`key`, U+001F, window in ms).
pub fn validate_key(key: &str) -> Result<()> {
    validate_key_len(key)?;
    if key.as_bytes().contains(&0x1f) {
        return Err(Error::InvalidKey(
            "the key contains U+001F (unit separator), which names the buckets of a key's further rules".into(),
        ));
    }
    Ok(())
}

/// The admit path's check: non-empty, at most [`MAX_KEY_LEN`] bytes. (A key
/// with U+001F finds no entry it may use there and is refused on the cold
/// path, by [`validate_key`].)
#[inline]
pub fn validate_key_len(key: &str) -> Result<()> {
    // one compare on the admit path: 0 wraps to the largest length
    if key.len().wrapping_sub(1) >= MAX_KEY_LEN {
        return Err(key_len_error(key.len()));
    }
    Ok(())
}

/// The admit path's check: as [`validate_key_len`], but long enough for
/// the engine's own bucket names (a key's permit bucket is the key and a
/// 9-byte suffix). A caller's key of 513 to 521 bytes passes here, finds no
/// entry (none is made for it) and is refused on the cold path by
/// [`validate_key`], with the same error.
#[inline]
pub(crate) fn validate_bucket_len(key: &str) -> Result<()> {
    if key.len().wrapping_sub(1) >= MAX_KEY_LEN + MAX_BUCKET_SUFFIX {
        return Err(key_len_error(key.len()));
    }
    Ok(())
}

/// The longest suffix the engine adds to a key to name a bucket of its own.
pub(crate) const MAX_BUCKET_SUFFIX: usize = 9;

#[cold]
#[inline(never)]
fn key_len_error(len: usize) -> Error {
    if len == 0 {
        return Error::InvalidKey("the key is empty".into());
    }
    Error::InvalidKey(format!(
        "the key is {len} bytes long; at most {MAX_KEY_LEN} are allowed"
    ))
}

/// The limiter key an HTTP middleware uses for a raw key (a header, an
/// address, a user id): the raw key when it fits in [`MAX_KEY_LEN`] bytes and
/// holds no U+001F, else `"sha256:"` and the 64 hex digits of its SHA-256. A long header then
/// never turns a request into an error, and equal raw keys share one bucket
/// in every process and language. Every middleware uses this rule.
pub fn http_key(raw: &str) -> std::borrow::Cow<'_, str> {
    if raw.len() <= MAX_KEY_LEN && !raw.as_bytes().contains(&0x1f) {
        return raw.into();
    }
    sha256_text(raw, 32).into()
}

/// `"sha256:"` and the hex digits of the first `bytes` bytes of `text`'s SHA-256.
fn sha256_text(text: &str, bytes: usize) -> String {
    use sha2::{Digest, Sha256};
    use std::fmt::Write as _;
    let mut out = String::with_capacity(7 + 2 * bytes);
    out.push_str("sha256:");
    for b in &Sha256::digest(text.as_bytes())[..bytes] {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// A key as log lines name it: the first 16 hex digits of its SHA-256
/// (`sha256:1318642cb851c277`). Keys may be user ids or addresses, which a
/// log must not hold; an operator who suspects a key hashes it to compare
/// (`printf %s KEY | sha256sum`).
pub fn key_hash(key: &str) -> String {
    sha256_text(key, 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_name_a_key_by_its_hash() {
        // `printf abc | sha256sum` begins ba7816bf8f01cfea.
        assert_eq!(key_hash("abc"), "sha256:ba7816bf8f01cfea");
    }

    #[test]
    fn keys_are_checked() {
        assert!(validate_key("a").is_ok());
        assert_eq!(validate_key("").unwrap_err().kind(), crate::ErrorKind::InvalidKey);
        assert!(validate_key(&"x".repeat(MAX_KEY_LEN + 1)).is_err());
        let sep = validate_key("k\u{1f}60000").unwrap_err();
        assert_eq!(sep.kind(), crate::ErrorKind::InvalidKey);
        assert!(sep.to_string().contains("U+001F"), "{sep}");
        assert!(
            validate_key_len("k\u{1f}60000").is_ok(),
            "the admit path's check is the length's"
        );
    }

    #[test]
    fn http_keys_stay_within_the_limit() {
        assert_eq!(http_key("1.2.3.4"), "1.2.3.4");
        let max = "k".repeat(MAX_KEY_LEN);
        assert_eq!(http_key(&max), max.as_str());
        let long = "k".repeat(MAX_KEY_LEN + 1);
        let h = http_key(&long);
        assert!(h.starts_with("sha256:") && h.len() == 71, "{h}");
        assert!(validate_key(&h).is_ok());
        assert_eq!(h, http_key(&long), "stable");
        // the SHA-256 of "abc" repeated, checked against Python's hashlib
        let abc = "abc".repeat(200);
        assert_eq!(
            http_key(&abc),
            "sha256:1318642cb851c27771f76b674b229a3e49b577f6ed728e2beef0c27c38602d35"
        );
        // A raw value holding the rule separator is hashed (a valid key).
        let sep = http_key("user\u{1f}86400000");
        assert!(sep.starts_with("sha256:") && validate_key(&sep).is_ok(), "{sep}");
    }
}
