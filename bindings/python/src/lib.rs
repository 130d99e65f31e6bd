//! `quotalease._native`: the Python face of the quotalease engine.
//!
//! A thin translation layer: every rule lives in the `quotalease` crate. What
//! this file owns is Python-specific: argument conversion with Python
//! exceptions, releasing the GIL around every call that can wait, completing
//! asyncio futures from the broker thread, and forwarding backend events to
//! `logging` without ever touching the interpreter while it shuts down.

use std::cell::UnsafeCell;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyOverflowError, PyRuntimeError, PyStopIteration, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString, PyTuple, PyType};

use quotalease as ql;

create_exception!(
    quotalease,
    QuotaLeaseError,
    PyException,
    "Base class of every quotalease error: `except QuotaLeaseError` catches them all."
);

/// The specific exception classes. Built at import with two bases each (ours
/// and the matching built-in), which `create_exception!` cannot express.
struct ErrorTypes {
    config: Py<PyType>,
    invalid_key: Py<PyType>,
    invalid_cost: Py<PyType>,
    closed: Py<PyType>,
    backend: Py<PyType>,
    misconfigured: Py<PyType>,
    reservation: Py<PyType>,
}

static ERROR_TYPES: PyOnceLock<ErrorTypes> = PyOnceLock::new();
static RESOLVE_FUTURE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn error_types(py: Python<'_>) -> &ErrorTypes {
    ERROR_TYPES
        .get(py)
        .expect("quotalease._native initialises its exception types at import")
}

fn make_error_types(py: Python<'_>) -> PyResult<ErrorTypes> {
    let base = py.get_type::<QuotaLeaseError>();
    let builtins = py.import("builtins")?;
    let type_ = builtins.getattr("type")?;
    let make = |name: &str, extra: Option<Bound<'_, PyType>>, doc: &str| -> PyResult<Py<PyType>> {
        let bases = match extra {
            Some(extra) => PyTuple::new(py, [base.clone(), extra])?,
            None => PyTuple::new(py, [base.clone()])?,
        };
        let ns = PyDict::new(py);
        ns.set_item("__module__", "quotalease")?;
        ns.set_item("__doc__", doc)?;
        Ok(type_.call1((name, bases, ns))?.cast_into::<PyType>()?.unbind())
    };
    Ok(ErrorTypes {
        config: make(
            "ConfigError",
            Some(py.get_type::<PyValueError>()),
            "An invalid option (also a ValueError); the message names the option and what it accepts.",
        )?,
        invalid_key: make(
            "InvalidKeyError",
            Some(py.get_type::<PyValueError>()),
            "The key is empty or longer than 512 bytes (also a ValueError).",
        )?,
        invalid_cost: make(
            "InvalidCostError",
            Some(py.get_type::<PyValueError>()),
            "The cost is below 1 or above the key's limit (also a ValueError).",
        )?,
        closed: make(
            "ClosedError",
            Some(py.get_type::<PyRuntimeError>()),
            "The limiter was closed (also a RuntimeError); create a new Limiter.",
        )?,
        backend: make(
            "BackendError",
            None,
            "The backend failed a call that must reach it (flush, settle, inspect, check).",
        )?,
        misconfigured: make(
            "MisconfiguredError",
            None,
            "The backend is reachable but refuses the configuration (wrong or missing password, \
             a database it lacks, a cluster URL at a standalone server, a port that does not speak \
             Redis, an ACL user without the scripts' permissions): raised by acquire and check() \
             while it answers so; an outage is not an error.",
        )?,
        reservation: make(
            "ReservationError",
            Some(py.get_type::<PyValueError>()),
            "A reservation cannot be settled so (also a ValueError): it was settled already, it \
             was denied (nothing was reserved), or the actual cost is negative. Also raised by \
             `Permit.release` for a permit released already or denied (no permit was taken).",
        )?,
    })
}

fn to_pyerr(py: Python<'_>, e: ql::Error) -> PyErr {
    let t = error_types(py);
    let ty = match e.kind() {
        ql::ErrorKind::Config => &t.config,
        ql::ErrorKind::InvalidKey => &t.invalid_key,
        ql::ErrorKind::InvalidCost => &t.invalid_cost,
        ql::ErrorKind::Closed => &t.closed,
        ql::ErrorKind::Backend => &t.backend,
        ql::ErrorKind::Misconfigured => &t.misconfigured,
        ql::ErrorKind::Reservation => &t.reservation,
    };
    PyErr::from_type(ty.bind(py).clone(), e.to_string())
}

fn config_error(py: Python<'_>, msg: String) -> PyErr {
    PyErr::from_type(error_types(py).config.bind(py).clone(), msg)
}

// ---------------------------------------------------------------------------
// Calling Python from the broker thread.

/// Set by `_shutdown` (registered with `atexit`): from then on the broker
/// thread never attaches to the interpreter.
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);
/// Broker-thread calls between their shutdown check and their end.
static IN_CALLS: AtomicUsize = AtomicUsize::new(0);

/// Run `f` attached to the interpreter from a non-Python thread, unless the
/// interpreter is shutting down (then `None`: nothing runs).
fn with_python<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> Option<R> {
    IN_CALLS.fetch_add(1, SeqCst);
    let r = if SHUTTING_DOWN.load(SeqCst) {
        None
    } else {
        Python::try_attach(f)
    };
    IN_CALLS.fetch_sub(1, SeqCst);
    r
}

/// `atexit` hook: stop calling into Python from the broker thread, and wait
/// (GIL released, at most 2 s) for calls already past the check.
#[pyfunction]
fn _shutdown(py: Python<'_>) {
    SHUTTING_DOWN.store(true, SeqCst);
    py.detach(|| {
        let deadline = Instant::now() + Duration::from_secs(2);
        while IN_CALLS.load(SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}

/// `os.register_at_fork(after_in_child=...)`: calls that were in flight in
/// the parent's broker thread do not exist in the child.
#[pyfunction]
fn _after_fork_in_child() {
    IN_CALLS.store(0, SeqCst);
}

/// Scheduled on the event loop with `call_soon_threadsafe`: completes `fut`
/// unless it was cancelled meanwhile.
#[pyfunction]
fn _resolve_future(fut: &Bound<'_, PyAny>, ok: bool, value: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = fut.py();
    if fut.call_method0(intern!(py, "done"))?.is_truthy()? {
        return Ok(());
    }
    let method = if ok {
        intern!(py, "set_result")
    } else {
        intern!(py, "set_exception")
    };
    fut.call_method1(method, (value,))?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Argument conversion.

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// A non-negative integer option: bool and non-int are TypeError; negative
/// or too large is a ConfigError.
fn option_u64(obj: &Bound<'_, PyAny>, field: &str) -> PyResult<u64> {
    let py = obj.py();
    if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "`{field}` must be an int (got {})",
            type_name(obj)
        )));
    }
    obj.extract::<u64>().map_err(|_| {
        config_error(
            py,
            format!("invalid configuration: `{field}` must be a non-negative integer below 2^64 (got {obj})"),
        )
    })
}

fn opt_option_u64(obj: Option<&Bound<'_, PyAny>>, field: &str) -> PyResult<Option<u64>> {
    obj.filter(|o| !o.is_none()).map(|o| option_u64(o, field)).transpose()
}

/// Set one keyword argument of `Limiter(...)` as the core's option `name`:
/// None leaves the default, an int, float or str goes to the core as it is
/// (the core knows each option's type and range, and every name); a bool
/// goes only to an option that takes one (`shadow`): to a number option it
/// is a TypeError, not 0 or 1. Any other object is no option value:
/// TypeError, naming the type the core takes for `name`.
fn set_option(opts: &mut ql::Options, name: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
    let py = value.py();
    let v = if value.is_none() {
        Some(ql::OptionValue::Null)
    } else if let Ok(b) = value.cast::<PyBool>() {
        takes_bool(name).then(|| ql::OptionValue::Bool(b.is_true()))
    } else if let Ok(i) = value.cast::<PyInt>() {
        // Beyond i128 is beyond every option's range: the core says so.
        let n = i
            .extract::<i128>()
            .unwrap_or_else(|_| if i.lt(0).unwrap_or(false) { i128::MIN } else { i128::MAX });
        Some(ql::OptionValue::Int(n))
    } else if let Ok(f) = value.cast::<PyFloat>() {
        Some(ql::OptionValue::Float(f.value()))
    } else if let Ok(s) = value.cast::<PyString>() {
        Some(ql::OptionValue::Str(s.to_str()?))
    } else {
        None
    };
    if let Some(v) = v {
        return opts.set(name, v).map(drop).map_err(|e| to_pyerr(py, e));
    }
    // Ask the core whether `name` exists and takes a bool or a number.
    let expects = match ql::Options::new().set(name, ql::OptionValue::Int(0)) {
        Ok(_) if takes_bool(name) => "a bool",
        Ok(_) => "an int",
        Err(e @ ql::Error::UnknownOption { .. }) => return Err(to_pyerr(py, e)),
        Err(_) => "a str",
    };
    Err(PyTypeError::new_err(format!(
        "`{name}` must be {expects} (got {})",
        type_name(value)
    )))
}

/// Whether option `name` takes a bool (asked of the core).
fn takes_bool(name: &str) -> bool {
    ql::Options::new().set(name, ql::OptionValue::Bool(false)).is_ok()
}

/// The `cost` argument: an int from 1 to the key's limit (the engine checks
/// the upper bound). Negative or huge ints are InvalidCostError, other types
/// TypeError.
struct Cost(u64);

impl<'a, 'py> FromPyObject<'a, 'py> for Cost {
    type Error = PyErr;

    #[inline]
    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if !obj.is_instance_of::<PyBool>() {
            if let Ok(v) = obj.extract::<u64>() {
                return Ok(Cost(v));
            }
        }
        Err(cost_error(&obj.to_owned(), "cost"))
    }
}

/// The error for a cost argument (`field`: "cost", "estimate") that is no
/// u64: InvalidCostError for an int (negative or huge), else TypeError.
#[cold]
fn cost_error(obj: &Bound<'_, PyAny>, field: &str) -> PyErr {
    let py = obj.py();
    if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>() {
        return PyErr::from_type(
            error_types(py).invalid_cost.bind(py).clone(),
            format!("invalid cost {obj}: must be at least 1 and at most the key's limit"),
        );
    }
    PyTypeError::new_err(format!("`{field}` must be an int (got {})", type_name(obj)))
}

/// The `estimate` argument of `reserve`: converted as `cost` is (the core
/// checks 1 to the key's limit).
fn estimate_arg(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    if !obj.is_instance_of::<PyBool>() {
        if let Ok(v) = obj.extract::<u64>() {
            return Ok(v);
        }
    }
    Err(cost_error(obj, "estimate"))
}

/// The `actual` argument of `Reservation.settle`: an int, 0 or more. Other
/// types (bool too) are TypeError; a negative int is the core's
/// ReservationError (`Reservation::negative_actual`); an int of 2^64 or more
/// is OverflowError.
fn actual_arg(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    let py = obj.py();
    if obj.is_instance_of::<PyBool>() || !obj.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "`actual` must be an int (got {})",
            type_name(obj)
        )));
    }
    if let Ok(v) = obj.extract::<u64>() {
        return Ok(v);
    }
    if obj.lt(0)? {
        let n = obj.extract::<i128>().unwrap_or(i128::MIN);
        return Err(to_pyerr(py, ql::Reservation::negative_actual(n)));
    }
    Err(PyOverflowError::new_err(format!(
        "`actual` must be below 2^64 tokens (got {obj})"
    )))
}

/// The `tier` keyword: None (the default tier, or the limiter's limit) or a
/// tier's name as a str; any other type is a TypeError. An unknown name is
/// the core's config error (it names the known tiers).
#[inline]
fn tier_arg<'a>(tier: Option<&'a Bound<'_, PyAny>>) -> PyResult<Option<&'a str>> {
    match tier {
        None => Ok(None),
        Some(t) => match t.cast::<PyString>() {
            Ok(s) => Ok(Some(s.to_str()?)),
            Err(_) if t.is_none() => Ok(None),
            Err(_) => Err(PyTypeError::new_err(format!(
                "`tier` must be a str or None (got {})",
                type_name(t)
            ))),
        },
    }
}

/// The `wait_ms` argument: None (no wait) or a non-negative int of
/// milliseconds; bool and non-int are TypeError, negative is ConfigError.
fn wait_arg(wait_ms: Option<&Bound<'_, PyAny>>) -> PyResult<Option<std::time::Duration>> {
    Ok(opt_option_u64(wait_ms, "wait_ms")?.map(std::time::Duration::from_millis))
}

/// A str argument of the store API (`name`, `rules`, `assignment`):
/// TypeError naming the argument when it is not a str.
fn str_arg<'a>(obj: &'a Bound<'_, PyAny>, field: &str) -> PyResult<&'a str> {
    match obj.cast::<PyString>() {
        Ok(s) => s.to_str(),
        Err(_) => Err(PyTypeError::new_err(format!(
            "`{field}` must be a str (got {})",
            type_name(obj)
        ))),
    }
}

/// Rules as Python sees them: a tuple of `(limit, window_ms)` pairs.
fn rules_tuple<'py>(py: Python<'py>, rules: &ql::Rules) -> PyResult<Bound<'py, PyTuple>> {
    PyTuple::new(py, rules.as_slice().iter().map(|p| (p.limit, p.window_ms)))
}

// ---------------------------------------------------------------------------
// Decision.

/// A copy of `d`, read field by field. The admit path has just stored the
/// decision's fields one by one; a plain copy reads them back with 16-byte
/// loads, which wait for those stores to retire (a store-forwarding stall,
/// about 8 ns of a warm `acquire`: docs/benchmarks.md, "The decision read in
/// place"). Volatile reads keep the compiler from merging them into one copy.
#[inline(always)]
fn in_place(d: &ql::Decision) -> ql::Decision {
    // SAFETY: each pointer comes from a reference to a live, initialised field.
    unsafe {
        ql::Decision {
            allowed: std::ptr::read_volatile(&d.allowed),
            limit: std::ptr::read_volatile(&d.limit),
            remaining: std::ptr::read_volatile(&d.remaining),
            retry_after_ms: std::ptr::read_volatile(&d.retry_after_ms),
            reset_after_ms: std::ptr::read_volatile(&d.reset_after_ms),
            window_ms: std::ptr::read_volatile(&d.window_ms),
            reason: std::ptr::read_volatile(&d.reason),
            rule: std::ptr::read_volatile(&d.rule),
            rule_set: std::ptr::read_volatile(&d.rule_set),
        }
    }
}

// A free list: taking a new Decision from it instead of the allocator
// saves a few of a warm `acquire`'s ns (docs/benchmarks.md). `eq` cannot
// stand beside `freelist` in pyo3 0.30: `__richcmp__` below is what it
// would generate. A limiter also keeps the last Decision it returned and
// writes the next one into it when nothing else holds it any more
// (`Limiter::decision`), as CPython's `enumerate` and `zip` reuse their
// result tuple: a request handler drops its decision before the next
// request, so a warm `acquire` allocates and frees no object
// (docs/benchmarks.md, "Python: a Decision reused").
/// The outcome of one acquire. Immutable; true when allowed.
#[pyclass(frozen, freelist = 64, module = "quotalease._native", name = "Decision")]
struct Decision {
    cell: UnsafeCell<ql::Decision>,
}

// SAFETY: the cell is written only by `Limiter::decision`, while it holds
// the object's one reference (taken from the limiter's slot, reference
// count 1, the GIL held), so no other thread, and no other reference, can
// read it meanwhile; every reader holds a reference of its own.
unsafe impl Sync for Decision {}

impl Decision {
    fn new(d: ql::Decision) -> Self {
        Decision {
            cell: UnsafeCell::new(d),
        }
    }

    fn d(&self) -> &ql::Decision {
        // SAFETY: see `Sync` above: no write while a reference reads.
        unsafe { &*self.cell.get() }
    }
}

/// Every reason's name as an interned Python string, indexed by its code.
static REASON_NAMES: PyOnceLock<Vec<Py<PyString>>> = PyOnceLock::new();

fn reason_str<'py>(py: Python<'py>, r: ql::Reason) -> Bound<'py, PyString> {
    let names = REASON_NAMES.get_or_init(py, || {
        ql::Reason::ALL
            .iter()
            .map(|r| PyString::intern(py, r.as_str()).unbind())
            .collect()
    });
    names[r as usize].bind(py).clone()
}

#[pymethods]
impl Decision {
    /// Whether the request is admitted.
    #[getter]
    fn allowed(&self) -> bool {
        self.d().allowed
    }
    /// The key's limit (tokens per window).
    #[getter]
    fn limit(&self) -> u64 {
        self.d().limit
    }
    /// Best estimate of tokens left for this key across the fleet.
    #[getter]
    fn remaining(&self) -> u64 {
        self.d().remaining
    }
    /// When denied: milliseconds until a retry can succeed (0 when allowed).
    #[getter]
    fn retry_after_ms(&self) -> u64 {
        self.d().retry_after_ms
    }
    /// Milliseconds until the key's bucket would be full again.
    #[getter]
    fn reset_after_ms(&self) -> u64 {
        self.d().reset_after_ms
    }
    /// The key's window in milliseconds.
    #[getter]
    fn window_ms(&self) -> u64 {
        self.d().window_ms
    }
    /// lease, exhausted, fallback, pending, exact or local.
    #[getter]
    fn reason<'py>(&self, py: Python<'py>) -> Bound<'py, PyString> {
        reason_str(py, self.d().reason)
    }
    /// Every rule the key is held to, as `(limit, window_ms)` pairs (one
    /// unless its tier or policy has several). `limit`, `remaining`,
    /// `window_ms` and the times are those of `rules[rule]`.
    #[getter]
    fn rules<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        rules_tuple(py, &self.d().rules())
    }
    /// Index in `rules` of the binding rule: the one that denied or, when
    /// admitted, the one with the fewest tokens left.
    #[getter]
    fn rule(&self) -> u8 {
        self.d().rule
    }

    /// IETF RateLimit-Policy and RateLimit response headers, plus Retry-After
    /// (whole seconds) when denied.
    fn headers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.d().headers() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    fn __bool__(&self) -> bool {
        self.d().allowed
    }

    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: pyo3::basic::CompareOp) -> Py<PyAny> {
        let py = other.py();
        let same = match other.cast::<Decision>() {
            Ok(o) => self.d() == o.get().d(),
            Err(_) => return py.NotImplemented(),
        };
        match op {
            pyo3::basic::CompareOp::Eq => PyBool::new(py, same).to_owned().into_any().unbind(),
            pyo3::basic::CompareOp::Ne => PyBool::new(py, !same).to_owned().into_any().unbind(),
            _ => py.NotImplemented(),
        }
    }

    fn __repr__(&self) -> String {
        let d = self.d();
        let mut out = format!(
            "Decision(allowed={}, reason='{}', limit={}, remaining={}, retry_after_ms={}, reset_after_ms={}, window_ms={}",
            if d.allowed { "True" } else { "False" },
            d.reason.as_str(),
            d.limit,
            d.remaining,
            d.retry_after_ms,
            d.reset_after_ms,
            d.window_ms
        );
        // Several rules: which one bound, and all of them (as `rules` gives them).
        let rules = d.rules();
        if rules.len() > 1 {
            let pairs: Vec<String> = rules
                .as_slice()
                .iter()
                .map(|p| format!("({}, {})", p.limit, p.window_ms))
                .collect();
            out.push_str(&format!(", rule={}, rules=({})", d.rule, pairs.join(", ")));
        }
        out.push(')');
        out
    }
}

// ---------------------------------------------------------------------------
// Reservation.

/// A request admitted (or denied) at an estimate of its cost by
/// `Limiter.reserve`, to be settled once at its actual cost.
#[pyclass(frozen, module = "quotalease._native", name = "Reservation")]
struct Reservation {
    r: ql::Reservation,
}

#[pymethods]
impl Reservation {
    /// Whether the request was admitted at its estimate.
    #[getter]
    fn allowed(&self) -> bool {
        self.r.allowed()
    }
    /// The decision on the estimate, as `acquire` would have returned it.
    #[getter]
    fn decision(&self) -> Decision {
        Decision::new(self.r.decision())
    }
    /// The tokens reserved.
    #[getter]
    fn estimate(&self) -> u64 {
        self.r.estimate()
    }
    /// The key reserved on.
    #[getter]
    fn key(&self) -> &str {
        self.r.key()
    }
    /// Whether `settle` was called (successfully or not).
    #[getter]
    fn settled(&self) -> bool {
        self.r.is_settled()
    }

    /// Settle at `actual` tokens (0 when the request used nothing): below
    /// the estimate the rest goes back, above it the key takes the
    /// difference, into debt if need be. Once only: ReservationError when
    /// settled already, denied, or `actual` is negative; ClosedError when
    /// the limiter was closed (the estimate stands).
    fn settle(&self, py: Python<'_>, actual: &Bound<'_, PyAny>) -> PyResult<()> {
        let actual = actual_arg(actual)?;
        py.detach(|| self.r.settle(actual)).map_err(|e| to_pyerr(py, e))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Nothing to do: unsettled, the reservation keeps its estimate.
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, PyTuple>) -> bool {
        false
    }

    fn __aenter__(slf: Py<Self>) -> Ready {
        Ready { value: slf.into_any() }
    }

    #[pyo3(signature = (*_exc))]
    fn __aexit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> Ready {
        Ready {
            value: PyBool::new(py, false).to_owned().into_any().unbind(),
        }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let key = PyString::new(py, self.r.key()).repr()?;
        Ok(format!(
            "Reservation(key={key}, estimate={}, allowed={}, settled={})",
            self.r.estimate(),
            if self.r.allowed() { "True" } else { "False" },
            if self.r.is_settled() { "True" } else { "False" },
        ))
    }
}

// ---------------------------------------------------------------------------
// Permit.

/// One of a key's requests in flight, from `Limiter.acquire_concurrent`:
/// admitted while fewer than `concurrency` of the key's requests are in
/// flight across the fleet. Released once with `release()` (or by leaving
/// its `with` / `async with` block; dropped unreleased, it is released).
#[pyclass(frozen, module = "quotalease._native", name = "Permit")]
struct Permit {
    p: ql::Permit,
}

impl Permit {
    /// What leaving a `with` block does: release an admitted permit not
    /// released yet (a denied one holds nothing).
    fn release_if_held(&self, py: Python<'_>) -> PyResult<()> {
        if self.p.allowed() && !self.p.is_released() {
            py.detach(|| self.p.release()).map_err(|e| to_pyerr(py, e))?;
        }
        Ok(())
    }
}

#[pymethods]
impl Permit {
    /// Whether the request may go ahead (a permit was taken).
    #[getter]
    fn allowed(&self) -> bool {
        self.p.allowed()
    }
    /// The decision: `limit` is the concurrency, `remaining` the permits
    /// left; a denial's `retry_after_ms` says when to ask again.
    #[getter]
    fn decision(&self) -> Decision {
        Decision::new(self.p.decision())
    }
    /// The key the permit is for.
    #[getter]
    fn key(&self) -> &str {
        self.p.key()
    }
    /// Whether `release` was called.
    #[getter]
    fn released(&self) -> bool {
        self.p.is_released()
    }

    /// Release the permit: the key may have one more request in flight.
    /// Once only: ReservationError when released already or denied (no
    /// permit was taken); ClosedError when the limiter was closed.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.p.release()).map_err(|e| to_pyerr(py, e))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Releases an admitted permit not released yet; exceptions go on.
    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.release_if_held(py)?;
        Ok(false)
    }

    fn __aenter__(slf: Py<Self>) -> Ready {
        Ready { value: slf.into_any() }
    }

    /// As `__exit__` (a release never waits for the backend).
    #[pyo3(signature = (*_exc))]
    fn __aexit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<Ready> {
        self.release_if_held(py)?;
        Ok(Ready {
            value: PyBool::new(py, false).to_owned().into_any().unbind(),
        })
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let key = PyString::new(py, self.p.key()).repr()?;
        Ok(format!(
            "Permit(key={key}, allowed={}, released={})",
            if self.p.allowed() { "True" } else { "False" },
            if self.p.is_released() { "True" } else { "False" },
        ))
    }
}

/// An awaitable ready at once with `value`: what `Reservation.__aenter__`
/// and `__aexit__` return (nothing to wait for, on any event loop).
#[pyclass(frozen, module = "quotalease._native", name = "_Ready")]
struct Ready {
    value: Py<PyAny>,
}

#[pymethods]
impl Ready {
    fn __await__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<()> {
        Err(PyStopIteration::new_err((self.value.clone_ref(py),)))
    }
}

// ---------------------------------------------------------------------------
// Limiter.

/// Where an `acquire_or_notify` (or `reserve_or_notify`) answer meets the
/// asyncio future waiting for it.
enum Slot<T> {
    Empty,
    Done(ql::Result<T>),
    Waiting(Py<PyAny>, Py<PyAny>),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What an asyncio future completed from the broker thread carries: a
/// Decision, a Reservation or a Permit.
trait Answer: Send + 'static {
    fn into_py_any(self, py: Python<'_>) -> PyResult<Py<PyAny>>;
}

impl Answer for ql::Decision {
    fn into_py_any(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(Py::new(py, Decision::new(self))?.into_any())
    }
}

impl Answer for ql::Reservation {
    fn into_py_any(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(Py::new(py, Reservation { r: self })?.into_any())
    }
}

impl Answer for ql::Permit {
    fn into_py_any(self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(Py::new(py, Permit { p: self })?.into_any())
    }
}

/// Runs on the broker thread once a pending acquire (or reserve) is decided.
/// A reservation nobody takes any more (the future was cancelled, the
/// interpreter is shutting down) is dropped: it keeps its estimate.
fn complete<T: Answer>(slot: &Mutex<Slot<T>>, res: ql::Result<T>) {
    let (event_loop, fut) = {
        let mut g = lock(slot);
        match std::mem::replace(&mut *g, Slot::Empty) {
            Slot::Waiting(l, f) => (l, f),
            _ => {
                *g = Slot::Done(res);
                return;
            }
        }
    };
    with_python(move |py| {
        let (ok, value) = match res.map_err(|e| to_pyerr(py, e)).and_then(|v| v.into_py_any(py)) {
            Ok(obj) => (true, obj),
            Err(e) => (false, e.into_value(py).into_any()),
        };
        let Some(resolve) = RESOLVE_FUTURE.get(py) else { return };
        // Fails only when the loop is closed: nobody waits any more.
        let _ = event_loop.call_method1(
            py,
            intern!(py, "call_soon_threadsafe"),
            (resolve.clone_ref(py), fut, ok, value),
        );
    });
}

/// The answer of a call that went to the broker: when `complete` ran
/// already, its value (or error) now; else a future of the running loop
/// that `complete` will resolve.
fn answer_or_future<'py, T: Answer>(py: Python<'py>, slot: &Mutex<Slot<T>>) -> PyResult<Bound<'py, PyAny>> {
    let event_loop = py
        .import(intern!(py, "asyncio"))?
        .call_method0(intern!(py, "get_running_loop"))?;
    let fut = event_loop.call_method0(intern!(py, "create_future"))?;
    let mut g = lock(slot);
    match std::mem::replace(&mut *g, Slot::Empty) {
        Slot::Done(res) => {
            drop(g);
            let v = res.map_err(|e| to_pyerr(py, e))?.into_py_any(py)?;
            Ok(v.into_bound(py))
        }
        _ => {
            *g = Slot::Waiting(event_loop.unbind(), fut.clone().unbind());
            Ok(fut)
        }
    }
}

/// A distributed rate limiter (see `quotalease.Limiter`).
#[pyclass(subclass, frozen, module = "quotalease._native", name = "Limiter")]
struct Limiter {
    inner: ql::Limiter,
    /// The last Decision `acquire` or `try_acquire` returned (an owned
    /// reference, or null), for `decision` to reuse.
    last: AtomicPtr<pyo3::ffi::PyObject>,
}

impl Drop for Limiter {
    fn drop(&mut self) {
        let p = *self.last.get_mut();
        if !p.is_null() {
            // SAFETY: the slot holds an owned reference.
            Python::attach(|py| drop(unsafe { Bound::from_owned_ptr(py, p) }));
        }
    }
}

impl Limiter {
    #[inline]
    fn decide<'py>(&self, py: Python<'py>, r: ql::Result<ql::Decision>) -> PyResult<Bound<'py, Decision>> {
        match r {
            Ok(d) => self.decision(py, d),
            Err(e) => Err(to_pyerr(py, e)),
        }
    }

    /// `d` as a Python Decision: the one this limiter returned last when
    /// nothing else holds it any more (its reference count is the slot's
    /// 1), written over; else a new one. A decision still held (kept in a
    /// variable across the next call, say) stays in the slot, to be reused
    /// when it is dropped. Reused or not, the caller cannot tell: a
    /// Decision is immutable, and one no reference reaches is gone.
    #[inline]
    fn decision<'py>(&self, py: Python<'py>, d: ql::Decision) -> PyResult<Bound<'py, Decision>> {
        let p = self.last.swap(ptr::null_mut(), Acquire);
        if !p.is_null() {
            // SAFETY: `p` is the slot's owned reference to a Decision, now
            // this call's alone (swapped out).
            let last = unsafe { Bound::from_owned_ptr(py, p).cast_into_unchecked::<Decision>() };
            // SAFETY: `p` is live (the reference above).
            if unsafe { pyo3::ffi::Py_REFCNT(p) } == 1 {
                // SAFETY: the only reference is ours and the GIL is held:
                // nothing can read the cell while it is written.
                unsafe { *last.get().cell.get() = d };
                self.keep(last.clone());
                return Ok(last);
            }
            self.keep(last);
        }
        let fresh = Bound::new(py, Decision::new(d))?;
        if self.last.load(Relaxed).is_null() {
            self.keep(fresh.clone());
        }
        Ok(fresh)
    }

    /// Put `d` in the slot, or drop it when another call filled the slot first.
    fn keep(&self, d: Bound<'_, Decision>) {
        let p = d.into_ptr();
        if self
            .last
            .compare_exchange(ptr::null_mut(), p, Release, Relaxed)
            .is_err()
        {
            // SAFETY: `p` is the owned reference `into_ptr` gave up.
            unsafe { pyo3::ffi::Py_DECREF(p) };
        }
    }
}

#[pymethods]
impl Limiter {
    // Every keyword argument but `on_event` is an option of the core,
    // set by name (`quotalease::Options`): a misspelt one is a ConfigError
    // with a suggestion, never a silent default.
    #[new]
    #[pyo3(signature = (url = "memory://", *, on_event = None, **options))]
    fn new(
        py: Python<'_>,
        url: &str,
        on_event: Option<&Bound<'_, PyAny>>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let err = |e: ql::Error| to_pyerr(py, e);
        let mut opts = ql::Options::new();
        opts.set("url", ql::OptionValue::Str(url)).map_err(err)?;
        if let Some(options) = options {
            for (name, value) in options.iter() {
                set_option(&mut opts, name.cast::<PyString>()?.to_str()?, &value)?;
            }
        }
        let callback = match on_event {
            Some(cb) if !cb.is_none() => {
                if !cb.is_callable() {
                    return Err(PyTypeError::new_err(format!(
                        "`on_event` must be a callable taking (kind, message) (got {})",
                        type_name(cb)
                    )));
                }
                Some(cb.clone().unbind())
            }
            _ => None,
        };
        let inner = ql::Limiter::from_options(opts).map_err(err)?;
        inner.on_event(move |ev: &ql::Event| {
            with_python(|py| forward_event(py, ev, callback.as_ref()));
        });
        Ok(Limiter {
            inner,
            last: AtomicPtr::new(ptr::null_mut()),
        })
    }

    /// Take `cost` tokens for `key`; waits (GIL released, at most
    /// backend_timeout_ms) only when the key has no local lease. `tier`
    /// names the key's plan tier (None: the default tier, or the limit).
    /// `wait_ms`: wait up to that long for the tokens instead of denying
    /// (in arrival order among this process's waiters of the key).
    #[pyo3(
        signature = (key, cost = Cost(1), *, tier = None, wait_ms = None),
        text_signature = "($self, key, cost=1, *, tier=None, wait_ms=None)"
    )]
    #[inline]
    fn acquire<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        cost: Cost,
        tier: Option<&Bound<'_, PyAny>>,
        wait_ms: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, Decision>> {
        let tier = tier_arg(tier)?;
        if let Some(wait) = wait_arg(wait_ms)? {
            let r = py.detach(|| self.inner.acquire_wait(key, cost.0, tier, wait));
            return self.decide(py, r);
        }
        match self.inner.acquire_local_with(key, cost.0, tier) {
            Ok(Some(ref d)) => self.decision(py, in_place(d)),
            Ok(None) => {
                let r = py.detach(|| self.inner.acquire_with(key, cost.0, tier));
                self.decide(py, r)
            }
            Err(e) => Err(to_pyerr(py, e)),
        }
    }

    /// Like acquire, but never waits: with no local tokens and a lease
    /// request needed, it starts one and denies with reason "pending".
    #[pyo3(
        signature = (key, cost = Cost(1), *, tier = None),
        text_signature = "($self, key, cost=1, *, tier=None)"
    )]
    fn try_acquire<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        cost: Cost,
        tier: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, Decision>> {
        let r = self.inner.try_acquire_with(key, cost.0, tier_arg(tier)?);
        self.decide(py, r)
    }

    /// For `Limiter.acquire_async`: a Decision when decided now, else an
    /// asyncio future of the running loop, completed from the broker thread.
    #[pyo3(
        signature = (key, cost = Cost(1), *, tier = None, wait_ms = None),
        text_signature = "($self, key, cost=1, *, tier=None, wait_ms=None)"
    )]
    fn _acquire_or_future<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        cost: Cost,
        tier: Option<&Bound<'_, PyAny>>,
        wait_ms: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let tier = tier_arg(tier)?;
        let wait = wait_arg(wait_ms)?;
        if wait.is_none() {
            if let Some(d) = self
                .inner
                .acquire_local_with(key, cost.0, tier)
                .map_err(|e| to_pyerr(py, e))?
            {
                return Ok(Bound::new(py, Decision::new(d))?.into_any());
            }
        }
        let slot = Arc::new(Mutex::new(Slot::Empty));
        let theirs = slot.clone();
        let done = move |res| complete(&theirs, res);
        let now = match wait {
            Some(wait) => self.inner.acquire_wait_or_notify(key, cost.0, tier, wait, done),
            None => self.inner.acquire_or_notify_with(key, cost.0, tier, done),
        }
        .map_err(|e| to_pyerr(py, e))?;
        if let Some(d) = now {
            return Ok(Bound::new(py, Decision::new(d))?.into_any());
        }
        answer_or_future(py, &slot)
    }

    /// Admit (or deny) a request at `estimate` tokens of `key`, to be
    /// settled once with its actual cost (`Reservation.settle`). Decided as
    /// `acquire(key, estimate, tier=tier)` decides, waiting (GIL released)
    /// when the key has no local lease.
    #[pyo3(signature = (key, estimate, *, tier = None))]
    fn reserve(
        &self,
        py: Python<'_>,
        key: &str,
        estimate: &Bound<'_, PyAny>,
        tier: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Reservation> {
        let estimate = estimate_arg(estimate)?;
        let tier = tier_arg(tier)?;
        py.detach(|| self.inner.reserve(key, estimate, tier))
            .map(|r| Reservation { r })
            .map_err(|e| to_pyerr(py, e))
    }

    /// For `Limiter.reserve_async`: a Reservation when decided now, else an
    /// asyncio future of the running loop, completed from the broker thread.
    #[pyo3(signature = (key, estimate, *, tier = None))]
    fn _reserve_or_future<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        estimate: &Bound<'_, PyAny>,
        tier: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let estimate = estimate_arg(estimate)?;
        let tier = tier_arg(tier)?;
        let slot = Arc::new(Mutex::new(Slot::Empty));
        let theirs = slot.clone();
        let now = self
            .inner
            .reserve_or_notify(key, estimate, tier, move |res| complete(&theirs, res))
            .map_err(|e| to_pyerr(py, e))?;
        if let Some(r) = now {
            return Ok(Bound::new(py, Reservation { r })?.into_any());
        }
        answer_or_future(py, &slot)
    }

    /// Take a permit for one request of `key` in flight (the limiter's
    /// `concurrency`, or the "N concurrent" of the key's rules: its own
    /// entry's, `tier`'s or its assigned tier's): admitted while fewer than
    /// that many of the key's requests are in flight across the fleet, else
    /// denied. Waits (GIL released, at most backend_timeout_ms) when the key
    /// has no local lease of permits. ConfigError when the key has no
    /// concurrency limit or the tier is unknown.
    #[pyo3(signature = (key, *, tier = None))]
    fn acquire_concurrent(&self, py: Python<'_>, key: &str, tier: Option<&Bound<'_, PyAny>>) -> PyResult<Permit> {
        let tier = tier_arg(tier)?;
        py.detach(|| self.inner.acquire_concurrent(key, tier))
            .map(|p| Permit { p })
            .map_err(|e| to_pyerr(py, e))
    }

    /// For `Limiter.acquire_concurrent_async`: a Permit when decided now,
    /// else an asyncio future of the running loop, completed from the
    /// broker thread.
    #[pyo3(signature = (key, *, tier = None))]
    fn _acquire_concurrent_or_future<'py>(
        &self,
        py: Python<'py>,
        key: &str,
        tier: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let tier = tier_arg(tier)?;
        let slot = Arc::new(Mutex::new(Slot::Empty));
        let theirs = slot.clone();
        let now = self
            .inner
            .acquire_concurrent_or_notify(key, tier, move |res| complete(&theirs, res))
            .map_err(|e| to_pyerr(py, e))?;
        if let Some(p) = now {
            return Ok(Bound::new(py, Permit { p })?.into_any());
        }
        answer_or_future(py, &slot)
    }

    /// How many requests of `key` wait (`acquire(..., wait_ms=...)`) in this process now.
    fn waiters(&self, key: &str) -> usize {
        self.inner.waiters(key)
    }

    /// Override one key's policy (window_ms defaults to the limiter's).
    #[pyo3(signature = (key, limit, window_ms = None))]
    fn set_limit(
        &self,
        py: Python<'_>,
        key: &str,
        limit: &Bound<'_, PyAny>,
        window_ms: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let limit = option_u64(limit, "limit")?;
        let window = opt_option_u64(window_ms, "window_ms")?.unwrap_or(self.inner.config().window_ms);
        py.detach(|| self.inner.set_limit(key, limit, window))
            .map_err(|e| to_pyerr(py, e))
    }

    /// A snapshot of the counters, by their names in docs/design.md.
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, _, _, v) in self.inner.metrics().fields() {
            d.set_item(name, v)?;
        }
        Ok(d)
    }

    /// The counters in Prometheus text format (prefix `quotalease_`), with
    /// `labels` on every sample; several limiters in one exposition:
    /// `quotalease.metrics_prometheus([(limiter, labels), ...])`.
    #[pyo3(signature = (labels = None))]
    fn metrics_prometheus(&self, py: Python<'_>, labels: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
        let labels = label_pairs(labels)?;
        let refs: Vec<(&str, &str)> = labels.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        self.inner.metrics_prometheus_with(&refs).map_err(|e| to_pyerr(py, e))
    }

    /// Connect to the backend now and run a read-only probe through the
    /// path leases take: None when leases can be taken, MisconfiguredError
    /// when the backend refuses the configuration, BackendError when it
    /// cannot be reached. The GIL is released while it waits.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.check()).map_err(|e| to_pyerr(py, e))
    }

    /// Give every leased token back now and wait for the backend to take them.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.flush()).map_err(|e| to_pyerr(py, e))
    }

    /// Flush and stop; later calls raise ClosedError. Idempotent.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.close()).map_err(|e| to_pyerr(py, e))
    }

    /// For tests with clock="manual": move the clock forward by `ms`.
    fn advance_clock(&self, py: Python<'_>, ms: &Bound<'_, PyAny>) -> PyResult<()> {
        let ms = option_u64(ms, "ms")?;
        self.inner.advance_clock(ms).map_err(|e| to_pyerr(py, e))
    }

    /// For tests: run lease-TTL maintenance, then wait until no backend
    /// request is in flight.
    fn settle(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.settle()).map_err(|e| to_pyerr(py, e))
    }

    /// What the limiter and the authority know about `key` ("why was this denied?").
    fn inspect<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyDict>> {
        let i = py.detach(|| self.inner.inspect(key)).map_err(|e| to_pyerr(py, e))?;
        let d = PyDict::new(py);
        d.set_item("limit", i.limit)?;
        d.set_item("window_ms", i.window_ms)?;
        d.set_item("authority_tokens", i.authority_tokens)?;
        d.set_item("authority_refilled_at_ms", i.authority_refilled_at_ms)?;
        d.set_item("authority_ttl_ms", i.authority_ttl_ms)?;
        d.set_item("local_tokens", i.local_tokens)?;
        d.set_item("lease_in_flight", i.lease_in_flight)?;
        d.set_item("exhausted_for_ms", i.exhausted_for_ms)?;
        d.set_item("admitted", i.admitted)?;
        d.set_item("denied", i.denied)?;
        d.set_item("rate_per_window", i.rate_per_window)?;
        d.set_item("holders", i.holders)?;
        d.set_item("fallback_per_window", i.fallback_per_window)?;
        d.set_item("demand_per_s", i.demand_per_s)?;
        d.set_item("rules", i.rules)?;
        d.set_item("tier", i.tier)?;
        d.set_item("policy_source", i.policy_source)?;
        Ok(d)
    }

    /// The rules `key` is held to on a call naming `tier`, and why: a dict
    /// with `rules` (`(limit, window_ms)` pairs), `tier` (or None),
    /// `assigned_by`, `defined_by`, `access` (`"unlimited"` or `"blocked"`
    /// for an allow or deny entry, else None) and `source` (the core's
    /// sentence). Reads
    /// what this limiter knows; no call to the store.
    #[pyo3(signature = (key, tier = None))]
    fn policy<'py>(&self, py: Python<'py>, key: &str, tier: Option<&Bound<'_, PyAny>>) -> PyResult<Bound<'py, PyDict>> {
        let (rules, source) = self.inner.policy(key, tier_arg(tier)?).map_err(|e| to_pyerr(py, e))?;
        let d = PyDict::new(py);
        d.set_item("rules", rules_tuple(py, &rules)?)?;
        d.set_item("tier", source.tier.as_deref())?;
        d.set_item("assigned_by", source.assigned_by.as_str())?;
        d.set_item("defined_by", source.defined_by.as_str())?;
        d.set_item("access", source.access.map(|a| a.as_str()))?;
        d.set_item("source", source.to_string())?;
        Ok(d)
    }

    /// Every tier this limiter knows now, by name: `{name: {"rules":
    /// ((limit, window_ms), ...), "defined_by": "config" | "file" | "store"}}`.
    fn tiers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for (name, rules, origin) in self.inner.tiers() {
            let t = PyDict::new(py);
            t.set_item("rules", rules_tuple(py, &rules)?)?;
            t.set_item("defined_by", origin.as_str())?;
            out.set_item(name, t)?;
        }
        Ok(out)
    }

    /// Define (or redefine) tier `name` as `rules` ("6000/min, 1000000/day")
    /// in the shared policy store; returns the store's version. Every
    /// limiter on the store follows within policy_refresh_ms, this one at once.
    fn policy_set_tier(&self, py: Python<'_>, name: &Bound<'_, PyAny>, rules: &Bound<'_, PyAny>) -> PyResult<u64> {
        let (name, rules) = (str_arg(name, "name")?, str_arg(rules, "rules")?);
        py.detach(|| self.inner.policy_set_tier(name, rules))
            .map_err(|e| to_pyerr(py, e))
    }

    /// Remove tier `name` from the store; returns the store's version.
    fn policy_delete_tier(&self, py: Python<'_>, name: &Bound<'_, PyAny>) -> PyResult<u64> {
        let name = str_arg(name, "name")?;
        py.detach(|| self.inner.policy_delete_tier(name))
            .map_err(|e| to_pyerr(py, e))
    }

    /// Give `key` its own store entry: "tier:NAME" or rules ("10/s, 1000/day"),
    /// which wins over the tier callers name; returns the store's version.
    fn policy_assign(&self, py: Python<'_>, key: &str, assignment: &Bound<'_, PyAny>) -> PyResult<u64> {
        let assignment = str_arg(assignment, "assignment")?;
        py.detach(|| self.inner.policy_assign(key, assignment))
            .map_err(|e| to_pyerr(py, e))
    }

    /// Remove `key`'s store entry; returns the store's version.
    fn policy_unassign(&self, py: Python<'_>, key: &str) -> PyResult<u64> {
        py.detach(|| self.inner.policy_unassign(key))
            .map_err(|e| to_pyerr(py, e))
    }

    /// `key`'s store entry as stored ("tier:pro" or rules), or None.
    fn policy_get(&self, py: Python<'_>, key: &str) -> PyResult<Option<String>> {
        py.detach(|| self.inner.policy_get(key)).map_err(|e| to_pyerr(py, e))
    }

    /// What the store holds: `{"version": int, "tiers": {name: rules},
    /// "keys": {key: "tier:NAME" or rules}}`, sorted by name (stored text).
    /// Reads the whole store: an operator call, not one for requests.
    fn policy_list<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let list = py.detach(|| self.inner.policy_list()).map_err(|e| to_pyerr(py, e))?;
        let d = PyDict::new(py);
        d.set_item("version", list.version)?;
        let tiers = PyDict::new(py);
        for (name, rules) in list.tiers {
            tiers.set_item(name, rules)?;
        }
        d.set_item("tiers", tiers)?;
        let keys = PyDict::new(py);
        for (key, assignment) in list.keys {
            keys.set_item(key, assignment)?;
        }
        d.set_item("keys", keys)?;
        Ok(d)
    }

    /// Check the policy store (and policy_file) now and apply what changed
    /// before returning (the limiter does it every policy_refresh_ms).
    fn refresh_policies(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.inner.refresh_policies()).map_err(|e| to_pyerr(py, e))
    }

    /// Tokens borrowed per lease request (resolved default included).
    #[getter]
    fn lease_size(&self) -> u64 {
        self.inner.lease_size()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let c = self.inner.config();
        // What was configured: fixed leases of n, or 'adaptive' when no
        // lease_size was given (leases sized by demand), not the resolved size.
        let lease_size = match c.lease_size {
            Some(n) => n.to_string(),
            None => "'adaptive'".to_string(),
        };
        format!(
            "Limiter(url='{}', limit={}, window_ms={}, lease_size={lease_size}, mode='{}'{})",
            ql::redact_url(&c.url),
            c.limit,
            c.window_ms,
            c.mode.as_str(),
            if c.shadow { ", shadow=True" } else { "" }
        )
    }
}

fn forward_event(py: Python<'_>, ev: &ql::Event, callback: Option<&Py<PyAny>>) {
    let kind = ev.kind.as_str();
    // logging.ERROR when degraded, logging.WARNING when recovered.
    let level = match ev.kind {
        ql::EventKind::Degraded => 40,
        ql::EventKind::Recovered => 30,
    };
    let logged = py.import("logging").and_then(|logging| {
        let logger = logging.call_method1("getLogger", ("quotalease",))?;
        logger.call_method1("log", (level, "quotalease %s: %s", kind, &ev.message))
    });
    if let Err(e) = logged {
        e.write_unraisable(py, None);
    }
    if let Some(cb) = callback {
        if let Err(e) = cb.call1(py, (kind, &ev.message)) {
            e.write_unraisable(py, Some(cb.bind(py)));
        }
    }
}

/// The limiter key an HTTP middleware uses for `raw` (a header, an address):
/// `raw` itself when it fits in 512 UTF-8 bytes, else "sha256:" and its
/// SHA-256 in 64 hex digits, so an over-long key is limited, never an error.
#[pyfunction]
fn http_key<'py>(raw: &Bound<'py, PyString>) -> PyResult<Bound<'py, PyString>> {
    Ok(match ql::http_key(raw.to_str()?) {
        std::borrow::Cow::Borrowed(_) => raw.clone(),
        std::borrow::Cow::Owned(hashed) => PyString::new(raw.py(), &hashed),
    })
}

/// A labels mapping (`{"limiter": "api"}`) as pairs; None is no labels.
fn label_pairs(labels: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<(String, String)>> {
    let Some(labels) = labels.filter(|l| !l.is_none()) else {
        return Ok(Vec::new());
    };
    let items = labels
        .call_method0("items")
        .map_err(|_| PyTypeError::new_err("labels must be a mapping of str to str"))?;
    let mut out = Vec::new();
    for item in items.try_iter()? {
        let (name, value): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item?.extract()?;
        let (Ok(name), Ok(value)) = (name.cast::<PyString>(), value.cast::<PyString>()) else {
            return Err(PyTypeError::new_err("labels must be a mapping of str to str"));
        };
        out.push((name.to_str()?.to_owned(), value.to_str()?.to_owned()));
    }
    Ok(out)
}

/// Prometheus labels, name and value.
type Labels = Vec<(String, String)>;

/// Several limiters' counters in ONE Prometheus exposition: each family's
/// HELP and TYPE once, then one sample per limiter, told apart by its labels.
#[pyfunction]
fn metrics_prometheus(py: Python<'_>, limiters: &Bound<'_, PyAny>) -> PyResult<String> {
    let mut held: Vec<(Py<Limiter>, Labels)> = Vec::new();
    for item in limiters.try_iter()? {
        let item = item?;
        let (limiter, labels): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item
            .extract()
            .map_err(|_| PyTypeError::new_err("metrics_prometheus takes (limiter, labels) pairs"))?;
        let limiter = limiter
            .cast::<Limiter>()
            .map_err(|_| PyTypeError::new_err("metrics_prometheus takes (limiter, labels) pairs"))?;
        held.push((limiter.clone().unbind(), label_pairs(Some(&labels))?));
    }
    let refs: Vec<Vec<(&str, &str)>> = held
        .iter()
        .map(|(_, l)| l.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect())
        .collect();
    let pairs: Vec<(&ql::Limiter, &[(&str, &str)])> = held
        .iter()
        .zip(&refs)
        .map(|((l, _), r)| (&l.get().inner, r.as_slice()))
        .collect();
    ql::metrics_prometheus(&pairs).map_err(|e| to_pyerr(py, e))
}

/// The engine's version.
#[pyfunction]
fn version() -> &'static str {
    ql::VERSION
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let types = ERROR_TYPES.get_or_try_init(py, || make_error_types(py))?;
    m.add("QuotaLeaseError", py.get_type::<QuotaLeaseError>())?;
    m.add("ConfigError", types.config.clone_ref(py))?;
    m.add("InvalidKeyError", types.invalid_key.clone_ref(py))?;
    m.add("InvalidCostError", types.invalid_cost.clone_ref(py))?;
    m.add("ClosedError", types.closed.clone_ref(py))?;
    m.add("BackendError", types.backend.clone_ref(py))?;
    m.add("MisconfiguredError", types.misconfigured.clone_ref(py))?;
    m.add("ReservationError", types.reservation.clone_ref(py))?;
    m.add_class::<Limiter>()?;
    m.add_class::<Decision>()?;
    m.add_class::<Reservation>()?;
    m.add_class::<Permit>()?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_function(wrap_pyfunction!(http_key, m)?)?;
    m.add_function(wrap_pyfunction!(metrics_prometheus, m)?)?;
    m.add_function(wrap_pyfunction!(_shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(_after_fork_in_child, m)?)?;
    let resolve = wrap_pyfunction!(_resolve_future, m)?;
    m.add_function(resolve.clone())?;
    let _ = RESOLVE_FUTURE.set(py, resolve.into_any().unbind());
    m.add("__version__", ql::VERSION)?;
    Ok(())
}
