//! `acquire` on a warm key: the Rust API and the C ABI (`lease_acquire`,
//! called through an opaque function pointer as a C caller would through the
//! PLT) side by side in one process, interleaved rounds, min ns per call.
//!
//! Usage: `cargo bench -p quotalease-ffi --bench acquire -- [N] [ROUNDS]`
//! or `... -- rust-only N` / `ffi-only N` for instruction counts (callgrind).
use std::hint::black_box;
use std::time::Instant;

use lease::{lease_acquire, lease_decision, lease_status};
use quotalease::{ClockKind, Limiter};

type AcquireFn =
    unsafe extern "C" fn(*const lease::lease_limiter, *const u8, usize, u64, *mut lease_decision) -> lease_status;

const KEY: &str = "user:42";

fn rust_limiter() -> Limiter {
    Limiter::builder()
        .limit(1 << 40)
        .window_ms(1000)
        .lease_size(1 << 30)
        .clock(ClockKind::Manual { start_ms: 0 })
        .build()
        .unwrap()
}

fn c_limiter() -> *mut lease::lease_limiter {
    let mut cfg = std::mem::MaybeUninit::<lease::lease_config>::uninit();
    let mut l = std::ptr::null_mut();
    unsafe {
        lease::lease_config_init(cfg.as_mut_ptr());
        let mut cfg = cfg.assume_init();
        cfg.limit = 1 << 40;
        cfg.window_ms = 1000;
        cfg.lease_size = 1 << 30;
        cfg.clock = lease::LEASE_CLOCK_MANUAL;
        assert_eq!(lease::lease_limiter_new(&cfg, &mut l), lease_status::LEASE_OK);
    }
    l
}

fn rust_loop(l: &Limiter, n: u64) -> u64 {
    let mut allowed = 0;
    for _ in 0..n {
        allowed += black_box(l.acquire(black_box(KEY), 1).unwrap()).allowed as u64;
    }
    allowed
}

fn ffi_loop(f: AcquireFn, l: *const lease::lease_limiter, n: u64) -> u64 {
    let mut allowed = 0;
    let mut d = lease_decision::default();
    for _ in 0..n {
        let k = black_box(KEY);
        let s = unsafe { f(l, k.as_ptr(), k.len(), 1, &mut d) };
        assert_eq!(s, lease_status::LEASE_OK);
        allowed += d.allowed as u64;
    }
    allowed
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let rust = rust_limiter();
    let c = c_limiter();
    // An opaque pointer: the compiler cannot inline lease_acquire into the loop.
    let f: AcquireFn = black_box(lease_acquire as AcquireFn);
    rust_loop(&rust, 1000);
    ffi_loop(f, c, 1000);
    match args.first().map(String::as_str) {
        Some("rust-only") => {
            let n = args[1].parse().unwrap();
            assert_eq!(rust_loop(&rust, n), n);
        }
        Some("ffi-only") => {
            let n = args[1].parse().unwrap();
            assert_eq!(ffi_loop(f, c, n), n);
        }
        _ => {
            let n: u64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(2_000_000);
            let rounds: u32 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(7);
            let (mut best_rust, mut best_ffi) = (f64::MAX, f64::MAX);
            for _ in 0..rounds {
                let t = Instant::now();
                assert_eq!(rust_loop(&rust, n), n);
                best_rust = best_rust.min(t.elapsed().as_nanos() as f64 / n as f64);
                let t = Instant::now();
                assert_eq!(ffi_loop(f, c, n), n);
                best_ffi = best_ffi.min(t.elapsed().as_nanos() as f64 / n as f64);
            }
            println!("rust_acquire_ns={best_rust:.2}");
            println!("ffi_acquire_ns={best_ffi:.2}");
            println!("ffi_minus_rust_ns={:.2}", best_ffi - best_rust);
        }
    }
    unsafe { lease::lease_limiter_free(c) };
}
