//! Version macros of the header and `lease_version()`, checked against Cargo.toml at compile time.

use std::ffi::c_char;

/// Major version of the header (semver; 0.x: every minor may break the ABI).
pub const LEASE_VERSION_MAJOR: u32 = 0;
/// Minor version of the header.
pub const LEASE_VERSION_MINOR: u32 = 1;
/// Patch version of the header.
pub const LEASE_VERSION_PATCH: u32 = 0;

const fn parse_u32(s: &str) -> u32 {
    let b = s.as_bytes();
    let mut i = 0;
    let mut n = 0u32;
    while i < b.len() {
        assert!(b[i].is_ascii_digit(), "version component is not a number");
        n = n * 10 + (b[i] - b'0') as u32;
        i += 1;
    }
    n
}

// The header's macros must match Cargo.toml: bumping the crate version
// without updating them (and regenerating include/lease.h) fails the build.
const _: () = assert!(LEASE_VERSION_MAJOR == parse_u32(env!("CARGO_PKG_VERSION_MAJOR")));
const _: () = assert!(LEASE_VERSION_MINOR == parse_u32(env!("CARGO_PKG_VERSION_MINOR")));
const _: () = assert!(LEASE_VERSION_PATCH == parse_u32(env!("CARGO_PKG_VERSION_PATCH")));

/// The library's version, "MAJOR.MINOR.PATCH" (compare it with
/// the header's `LEASE_VERSION_STRING` to detect a header/library mismatch). Static
/// storage: never free it.
#[no_mangle]
pub extern "C" fn lease_version() -> *const c_char {
    ffi_boundary! {
        concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast::<c_char>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_matches_cargo_toml() {
        let s = unsafe { std::ffi::CStr::from_ptr(lease_version()) }.to_str().unwrap();
        assert_eq!(s, env!("CARGO_PKG_VERSION"));
        // The header's LEASE_VERSION_STRING is built from these three.
        assert_eq!(
            format!("{LEASE_VERSION_MAJOR}.{LEASE_VERSION_MINOR}.{LEASE_VERSION_PATCH}"),
            s
        );
        assert_eq!(s, quotalease::VERSION);
    }
}
