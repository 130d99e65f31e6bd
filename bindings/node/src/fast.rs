//! The hot path as raw N-API callbacks.
//!
//! napi-rs class methods pay for borrow tracking and class-identity checks on
//! every call (several hundred nanoseconds, measured); `acquire` is the one
//! call an application makes per request, so it is a plain N-API function
//! whose `data` pointer is the limiter itself: one `napi_get_cb_info`, one
//! string copy into a stack buffer, the engine call, one small integer back.
//! `reserve` and `reserveAsync` (reserve, then settle) share its argument
//! reading, so an estimate is checked exactly as a cost is.

use std::ffi::{c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::{Arc, Mutex};

use napi::bindgen_prelude::{Float64Array, ToNapiValue};
use napi::{sys, Env};
use quotalease::{Decision, Error as QlError, ErrorKind, Limiter, Reservation, RuleSet};

use crate::{
    calendar_code, code_of, code_of_decision, Deferred, Meet, NativeReservation, Notifier, Outcome, KEY_BUF, MAX_SAFE,
    SCRATCH_LEN,
};

/// What the raw functions share with the class object: the engine and the
/// scratch array decisions are written to.
pub(crate) struct Shared {
    pub limiter: Arc<Limiter>,
    scratch: *mut f64,
    scratch_len: usize,
    /// Holds a strong reference to the JS array, keeping `scratch` valid.
    _scratch_ref: Float64Array,
}

// SAFETY: `scratch` is only touched from the JS thread (the raw callbacks run
// there); the engine is thread-safe. The type is shared through an Arc whose
// holders are all finalized on the JS thread.
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

impl Shared {
    pub fn new(limiter: Arc<Limiter>, mut scratch: Float64Array) -> Self {
        // SAFETY: we only derive the pointer here; writes happen on the JS thread.
        let s = unsafe { scratch.as_mut() };
        Shared {
            limiter,
            scratch: s.as_mut_ptr(),
            scratch_len: s.len(),
            _scratch_ref: scratch,
        }
    }

    /// `[limit, remaining, retryAfterMs, resetAfterMs, windowMs, reason |
    /// allowed << 4, rule, rule count, then limit, windowMs and calendar
    /// code of each rule]` into the scratch array.
    #[inline(always)]
    fn write(&self, d: &Decision) {
        if self.scratch_len >= SCRATCH_LEN {
            // SAFETY: in bounds (checked: at most MAX_RULES rules fit), JS
            // thread only, array kept alive by `_scratch_ref`.
            unsafe {
                *self.scratch = num(&d.limit);
                *self.scratch.add(1) = num(&d.remaining);
                *self.scratch.add(2) = num(&d.retry_after_ms);
                *self.scratch.add(3) = num(&d.reset_after_ms);
                *self.scratch.add(4) = num(&d.window_ms);
                *self.scratch.add(5) = code_of_decision(d) as f64;
                *self.scratch.add(6) = d.rule as f64;
                if d.rule_set == RuleSet::default() {
                    // One rule, the decision's own, no calendar (a key with
                    // no tier and one rule): no lookup of the rule set.
                    *self.scratch.add(7) = 1.0;
                    *self.scratch.add(8) = d.limit as f64;
                    *self.scratch.add(9) = d.window_ms as f64;
                    *self.scratch.add(10) = 0.0;
                    return;
                }
                let all = d.rules();
                let rules = all.as_slice();
                *self.scratch.add(7) = rules.len() as f64;
                for (i, p) in rules.iter().enumerate() {
                    *self.scratch.add(8 + 3 * i) = p.limit as f64;
                    *self.scratch.add(9 + 3 * i) = p.window_ms as f64;
                    *self.scratch.add(10 + 3 * i) = calendar_code(p.calendar);
                }
            }
        }
    }
}

/// Field `v` of a decision as a JS number, read on its own: converted two
/// at a time (the vectorised `u64 -> f64`), two fields come in one 16-byte
/// load over the two 8-byte stores the admit path just made, which cannot
/// be forwarded: a stall of about 4 ns a call (perf on a warm `acquire`).
#[inline(always)]
fn num(v: &u64) -> f64 {
    // SAFETY: a reference is valid for reads.
    (unsafe { ptr::read_volatile(v) }) as f64
}

enum Thrown {
    Plain(&'static CStr, String),
    Type(&'static CStr, String),
    Range(&'static CStr, String),
}

impl From<QlError> for Thrown {
    fn from(e: QlError) -> Self {
        Thrown::Plain(code_of(e.kind()), e.to_string())
    }
}

unsafe fn throw(env: sys::napi_env, t: Thrown) -> sys::napi_value {
    let c = |m: String| CString::new(m.replace('\0', "\\0")).unwrap_or_default();
    unsafe {
        match t {
            Thrown::Plain(code, m) => sys::napi_throw_error(env, code.as_ptr(), c(m).as_ptr()),
            Thrown::Type(code, m) => sys::napi_throw_type_error(env, code.as_ptr(), c(m).as_ptr()),
            Thrown::Range(code, m) => sys::napi_throw_range_error(env, code.as_ptr(), c(m).as_ptr()),
        }
    };
    ptr::null_mut()
}

/// `typeof v`, for error messages.
unsafe fn type_name(env: sys::napi_env, v: sys::napi_value) -> &'static str {
    let mut t = 0;
    if unsafe { sys::napi_typeof(env, v, &mut t) } != sys::Status::napi_ok {
        return "unknown";
    }
    match t {
        sys::ValueType::napi_undefined => "undefined",
        sys::ValueType::napi_null => "null",
        sys::ValueType::napi_boolean => "boolean",
        sys::ValueType::napi_number => "number",
        sys::ValueType::napi_string => "string",
        sys::ValueType::napi_symbol => "symbol",
        sys::ValueType::napi_object => "object",
        sys::ValueType::napi_function => "function",
        sys::ValueType::napi_external => "external",
        sys::ValueType::napi_bigint => "bigint",
        _ => "unknown",
    }
}

/// Longest tier name the engine accepts is 64 bytes; a longer one is read
/// into the heap so the engine can name it in its error.
const TIER_BUF: usize = 128;

/// Read string argument `v` as UTF-8 into `buf` (no allocation unless it is
/// longer than `N - 4` bytes, when it goes to `spill`). `None` when `v` is
/// not a string.
unsafe fn read_str<'b, const N: usize>(
    env: sys::napi_env,
    v: sys::napi_value,
    buf: &'b mut std::mem::MaybeUninit<[u8; N]>,
    spill: &'b mut Vec<u8>,
) -> Option<std::result::Result<&'b str, std::str::Utf8Error>> {
    let mut len = 0usize;
    let p: *mut u8 = buf.as_mut_ptr().cast();
    // Most keys are ASCII: read as UTF-16 (V8 copies its one-byte string
    // out) and narrowed here. Read as UTF-8, V8 encodes it character by
    // character: 35 ns against 25 ns for the call with its read alone.
    let mut wide = std::mem::MaybeUninit::<[u16; N]>::uninit();
    let w: *mut u16 = wide.as_mut_ptr().cast();
    if unsafe { sys::napi_get_value_string_utf16(env, v, w, N, &mut len) } != sys::Status::napi_ok {
        return None;
    }
    if len + 1 < N {
        // SAFETY: N-API wrote `len` units; `buf` holds N bytes.
        let units = unsafe { std::slice::from_raw_parts(w, len) };
        let mut any = 0u16;
        for (i, &u) in units.iter().enumerate() {
            any |= u;
            unsafe { *p.add(i) = u as u8 };
        }
        if any < 0x80 {
            // SAFETY: `len` ASCII bytes written above; ASCII is UTF-8.
            return Some(Ok(unsafe {
                std::str::from_utf8_unchecked(std::slice::from_raw_parts(p, len))
            }));
        }
    }
    // Not ASCII (or longer than the buffer): as UTF-8, as V8 encodes it.
    if unsafe { sys::napi_get_value_string_utf8(env, v, p.cast(), N, &mut len) } != sys::Status::napi_ok {
        return None;
    }
    // V8 never splits a character: a string that did not fit stops at most 3
    // bytes short of the buffer's end.
    let bytes: &[u8] = if len + 4 < N {
        // SAFETY: N-API wrote `len` bytes.
        unsafe { std::slice::from_raw_parts(p, len) }
    } else {
        let mut full = 0usize;
        unsafe { sys::napi_get_value_string_utf8(env, v, ptr::null_mut(), 0, &mut full) };
        spill.resize(full + 1, 0);
        unsafe { sys::napi_get_value_string_utf8(env, v, spill.as_mut_ptr().cast(), full + 1, &mut len) };
        &spill[..len]
    };
    Some(if bytes.is_ascii() {
        // SAFETY: ASCII is UTF-8.
        Ok(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes)
    })
}

/// `undefined` or `null`.
unsafe fn is_nullish(env: sys::napi_env, v: sys::napi_value) -> bool {
    let mut t = 0;
    let ok = unsafe { sys::napi_typeof(env, v, &mut t) } == sys::Status::napi_ok;
    ok && (t == sys::ValueType::napi_undefined || t == sys::ValueType::napi_null)
}

/// Stack room for the arguments of one call.
struct ArgBufs {
    key: std::mem::MaybeUninit<[u8; KEY_BUF]>,
    key_spill: Vec<u8>,
    tier: std::mem::MaybeUninit<[u8; TIER_BUF]>,
    tier_spill: Vec<u8>,
}

/// Read the key argument (a string), the cost (1 when omitted or
/// `undefined`) and the tier (none when omitted, `undefined` or `null`).
unsafe fn args<'b>(
    env: sys::napi_env,
    argc: usize,
    argv: &[sys::napi_value; 3],
    bufs: &'b mut ArgBufs,
) -> Result<(&'b str, u64, Option<&'b str>), Thrown> {
    let key = match unsafe { read_str(env, argv[0], &mut bufs.key, &mut bufs.key_spill) } {
        Some(Ok(k)) => k,
        Some(Err(_)) => {
            return Err(Thrown::Type(
                code_of(ErrorKind::InvalidKey),
                "the key is not valid UTF-8".into(),
            ));
        }
        None => {
            return Err(Thrown::Type(
                code_of(ErrorKind::InvalidKey),
                format!("invalid key: the key must be a string (got {})", unsafe {
                    type_name(env, argv[0])
                }),
            ))
        }
    };
    let tier = if argc < 3 || unsafe { is_nullish(env, argv[2]) } {
        None
    } else {
        match unsafe { read_str(env, argv[2], &mut bufs.tier, &mut bufs.tier_spill) } {
            Some(Ok(t)) => Some(t),
            Some(Err(_)) => {
                return Err(Thrown::Type(
                    code_of(ErrorKind::Config),
                    "the tier is not valid UTF-8".into(),
                ));
            }
            None => {
                return Err(Thrown::Type(
                    code_of(ErrorKind::Config),
                    format!("invalid tier: the tier must be a string (got {})", unsafe {
                        type_name(env, argv[2])
                    }),
                ))
            }
        }
    };
    if argc < 2 || (argc >= 3 && unsafe { is_nullish(env, argv[1]) }) {
        return Ok((key, 1, tier));
    }
    let mut cost = 0f64;
    if unsafe { sys::napi_get_value_double(env, argv[1], &mut cost) } != sys::Status::napi_ok {
        return Err(Thrown::Type(
            code_of(ErrorKind::InvalidCost),
            format!("invalid cost: the cost must be a number (got {})", unsafe {
                type_name(env, argv[1])
            }),
        ));
    }
    if !(cost.is_finite() && (0.0..=MAX_SAFE).contains(&cost) && cost.fract() == 0.0) {
        return Err(Thrown::Range(
            code_of(ErrorKind::InvalidCost),
            format!("invalid cost {cost}: the cost must be a whole number >= 1"),
        ));
    }
    Ok((key, cost as u64, tier))
}

#[derive(Clone, Copy)]
enum Op {
    Acquire,
    TryAcquire,
    AcquireAsync,
    Reserve,
    ReserveAsync,
}

#[inline(always)]
unsafe fn call(env: sys::napi_env, info: sys::napi_callback_info, op: Op) -> sys::napi_value {
    let mut argc = 3usize;
    let mut argv = [ptr::null_mut(); 3];
    let mut data = ptr::null_mut();
    unsafe { sys::napi_get_cb_info(env, info, &mut argc, argv.as_mut_ptr(), ptr::null_mut(), &mut data) };
    // SAFETY: `data` is the `Shared` this function was created with, kept
    // alive until the function is finalized.
    let shared = unsafe { &*(data as *const Shared) };
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<sys::napi_value, Thrown> {
        let mut bufs = ArgBufs {
            key: std::mem::MaybeUninit::uninit(),
            key_spill: Vec::new(),
            tier: std::mem::MaybeUninit::uninit(),
            tier_spill: Vec::new(),
        };
        // SAFETY: N-API writes the bytes it reports; we only read those.
        let (key, cost, tier) = unsafe { args(env, argc, &argv, &mut bufs)? };
        // No tier: the engine's plain calls, whose admit path skips the tier check.
        let l = &shared.limiter;
        match (op, tier) {
            // (the decision read in place: `Limiter::decide`)
            (Op::Acquire, None) => l.decide(key, cost, None, true, |d| shared.write(d))?,
            (Op::Acquire, Some(_)) => l.decide(key, cost, tier, true, |d| shared.write(d))?,
            (Op::TryAcquire, None) => l.decide(key, cost, None, false, |d| shared.write(d))?,
            (Op::TryAcquire, Some(_)) => l.decide(key, cost, tier, false, |d| shared.write(d))?,
            (Op::AcquireAsync, _) => return unsafe { acquire_async(env, shared, key, cost, tier) },
            (Op::Reserve, _) => return unsafe { reservation_value(env, l.reserve(key, cost, tier)?) },
            (Op::ReserveAsync, _) => return unsafe { reserve_async(env, shared, key, cost, tier) },
        }
        // A null result reads as `undefined` in JS.
        Ok(ptr::null_mut())
    }));
    match r {
        Ok(Ok(v)) => v,
        Ok(Err(t)) => unsafe { throw(env, t) },
        Err(_) => unsafe {
            throw(
                env,
                Thrown::Plain(
                    code_of(ErrorKind::Backend),
                    "internal error (panic) in quotalease".into(),
                ),
            )
        },
    }
}

/// `undefined` (null) when decided now, with the decision in the scratch
/// array; a Promise when the engine waits for the backend: it settles from
/// the broker thread.
unsafe fn acquire_async(
    env: sys::napi_env,
    shared: &Shared,
    key: &str,
    cost: u64,
    tier: Option<&str>,
) -> Result<sys::napi_value, Thrown> {
    // Decided by local tokens: the decision read in place (`Limiter::decide`)
    // and no notifier made.
    let local = match tier {
        None => shared.limiter.acquire_local(key, cost),
        Some(_) => shared.limiter.acquire_local_with(key, cost, tier),
    };
    match local {
        Ok(Some(ref d)) => {
            shared.write(d);
            return Ok(ptr::null_mut());
        }
        Ok(None) => {}
        Err(e) => return Err(e.into()),
    }
    let (meet, mut notifier) = Notifier::<Decision>::pair();
    let done = move |r| notifier.fire(r);
    let now = match tier {
        None => shared.limiter.acquire_or_notify(key, cost, done)?,
        Some(_) => shared.limiter.acquire_or_notify_with(key, cost, tier, done)?,
    };
    unsafe {
        now_or_promise(env, &meet, now, |d| {
            shared.write(&d);
            Ok(ptr::null_mut())
        })
    }
}

/// A `NativeReservation` for `r`.
unsafe fn reservation_value(env: sys::napi_env, r: Reservation) -> Result<sys::napi_value, Thrown> {
    unsafe { ToNapiValue::to_napi_value(env, NativeReservation { inner: r }) }
        .map_err(|e| Thrown::Plain(code_of(ErrorKind::Backend), e.reason.clone()))
}

/// A `NativeReservation` when decided now; a Promise of one when the
/// engine waits for the backend: it settles from the broker thread.
unsafe fn reserve_async(
    env: sys::napi_env,
    shared: &Shared,
    key: &str,
    estimate: u64,
    tier: Option<&str>,
) -> Result<sys::napi_value, Thrown> {
    let (meet, mut notifier) = Notifier::<Reservation>::pair();
    let now = shared
        .limiter
        .reserve_or_notify(key, estimate, tier, move |r| notifier.fire(r))?;
    unsafe { now_or_promise(env, &meet, now, |r| reservation_value(env, r)) }
}

/// `decided(outcome)` when the engine decided at once (`now`) or the broker
/// answered before we got here; else a Promise the broker settles through
/// `meet`.
unsafe fn now_or_promise<T: Outcome>(
    env: sys::napi_env,
    meet: &Mutex<Meet<T>>,
    now: Option<T>,
    decided: impl FnOnce(T) -> Result<sys::napi_value, Thrown>,
) -> Result<sys::napi_value, Thrown> {
    if let Some(v) = now {
        return decided(v);
    }
    let mut g = meet.lock().unwrap_or_else(|p| p.into_inner());
    if let Meet::Ready(r) = std::mem::replace(&mut *g, Meet::Empty) {
        // The broker answered before we got here: no promise needed.
        drop(g);
        return decided(r?);
    }
    let env = Env::from_raw(env);
    let (deferred, promise): (Deferred, _) = env
        .create_deferred()
        .map_err(|e| Thrown::Plain(code_of(ErrorKind::Backend), e.reason.clone()))?;
    *g = Meet::Waiting(deferred);
    let raw = unsafe { ToNapiValue::to_napi_value(env.raw(), promise) }
        .map_err(|e| Thrown::Plain(code_of(ErrorKind::Backend), e.reason.clone()))?;
    Ok(raw)
}

unsafe extern "C" fn acquire_cb(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    unsafe { call(env, info, Op::Acquire) }
}

unsafe extern "C" fn try_acquire_cb(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    unsafe { call(env, info, Op::TryAcquire) }
}

unsafe extern "C" fn acquire_async_cb(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    unsafe { call(env, info, Op::AcquireAsync) }
}

unsafe extern "C" fn reserve_cb(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    unsafe { call(env, info, Op::Reserve) }
}

unsafe extern "C" fn reserve_async_cb(env: sys::napi_env, info: sys::napi_callback_info) -> sys::napi_value {
    unsafe { call(env, info, Op::ReserveAsync) }
}

unsafe extern "C" fn finalize(_env: sys::napi_env, data: *mut c_void, _hint: *mut c_void) {
    // SAFETY: `data` came from `Arc::into_raw` in `make`.
    drop(unsafe { Arc::from_raw(data as *const Shared) });
}

/// An object `{ acquire, tryAcquire, acquireAsync, reserve, reserveAsync }`
/// of raw functions bound to `shared`.
pub(crate) fn functions(env: &Env, shared: &Arc<Shared>) -> napi::Result<sys::napi_value> {
    let raw_env = env.raw();
    let mut obj = ptr::null_mut();
    napi::check_status!(unsafe { sys::napi_create_object(raw_env, &mut obj) })?;
    let table: [(&CStr, sys::napi_callback); 5] = [
        (c"acquire", Some(acquire_cb)),
        (c"tryAcquire", Some(try_acquire_cb)),
        (c"acquireAsync", Some(acquire_async_cb)),
        (c"reserve", Some(reserve_cb)),
        (c"reserveAsync", Some(reserve_async_cb)),
    ];
    for (name, cb) in table {
        let data = Arc::into_raw(shared.clone()) as *mut c_void;
        let mut f = ptr::null_mut();
        let made = unsafe { sys::napi_create_function(raw_env, name.as_ptr(), -1, cb, data, &mut f) };
        if made != sys::Status::napi_ok {
            // SAFETY: nothing took ownership of `data`.
            drop(unsafe { Arc::from_raw(data as *const Shared) });
            napi::check_status!(made)?;
        }
        napi::check_status!(unsafe {
            sys::napi_add_finalizer(raw_env, f, data, Some(finalize), ptr::null_mut(), ptr::null_mut())
        })?;
        napi::check_status!(unsafe { sys::napi_set_named_property(raw_env, obj, name.as_ptr(), f) })?;
    }
    Ok(obj)
}
