//! The conformance-vector runner (format: tests/vectors/README.md), against
//! the in-memory authority and a real redis-server.

mod common;

use std::path::PathBuf;

use quotalease::{Config, Decision, Error, Limiter, Metrics, OptionValue, Options};
use serde_json::{Map, Value};

fn kind_name(e: &Error) -> &'static str {
    e.kind().as_str()
}

/// The vector's options, set by name as every binding sets them, over the
/// runner's own: the authority, a namespace and the manual clock (which
/// starts at 1 000 000 ms, as the vectors expect).
fn config_from(json: &Map<String, Value>, url: &str, prefix: &str) -> Result<Config, Error> {
    let mut o = Options::new();
    o.set("url", OptionValue::Str(url))?;
    o.set("key_prefix", OptionValue::Str(prefix))?;
    o.set("clock", OptionValue::Str("manual"))?;
    for (k, v) in json {
        let value = match v {
            Value::Number(n) => OptionValue::Int(
                n.as_i64()
                    .map(i128::from)
                    .or(n.as_u64().map(i128::from))
                    .unwrap_or_else(|| panic!("{k} must be an integer")),
            ),
            Value::String(s) => OptionValue::Str(s),
            other => panic!("{k}: unexpected value {other}"),
        };
        o.set(k, value)?;
    }
    o.into_config()
}

fn key_of(step: &Value) -> String {
    match &step["key"] {
        Value::String(s) => s.clone(),
        Value::Object(o) => o["repeat"]
            .as_str()
            .unwrap()
            .repeat(o["times"].as_u64().unwrap() as usize),
        _ => "k".to_string(),
    }
}

fn check_decision(ctx: &str, d: &Decision, expect: &Value) {
    for (k, v) in expect.as_object().expect("expect is an object") {
        let got = match k.as_str() {
            "allowed" => Value::from(d.allowed),
            "reason" => Value::from(d.reason.as_str()),
            "limit" => Value::from(d.limit),
            "remaining" => Value::from(d.remaining),
            "retry_after_ms" => Value::from(d.retry_after_ms),
            "reset_after_ms" => Value::from(d.reset_after_ms),
            "window_ms" => Value::from(d.window_ms),
            "rule" => Value::from(d.rule),
            other => panic!("{ctx}: unknown decision field {other}"),
        };
        assert_eq!(&got, v, "{ctx}: field {k} of {d:?}");
    }
}

fn check_metrics(ctx: &str, m: &Metrics, expect: &Value) {
    let fields = m.fields();
    for (k, v) in expect.as_object().expect("expect is an object") {
        let got = fields
            .iter()
            .find(|f| f.0 == k)
            .unwrap_or_else(|| panic!("{ctx}: unknown metric {k}"))
            .3;
        assert_eq!(Value::from(got), *v, "{ctx}: metric {k} of {m:?}");
    }
}

fn run_vector(path: &PathBuf, backend: &str, redis_url: Option<&str>) -> usize {
    let text = std::fs::read_to_string(path).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let name = v["name"].as_str().unwrap();
    let base = v["config"].as_object().cloned().unwrap_or_default();
    let ns = common::unique("v");
    let url = redis_url
        .map(str::to_string)
        .unwrap_or_else(|| format!("memory://{name}-{ns}"));
    let instances = v["instances"].as_u64().unwrap_or(1) as usize;
    let limiters: Vec<Limiter> = (0..instances)
        .map(|_| Limiter::new(config_from(&base, &url, &ns).unwrap()).unwrap_or_else(|e| panic!("{name}: {e}")))
        .collect();
    let settle = |ls: &[Limiter]| {
        for l in ls {
            match l.settle() {
                Ok(()) | Err(Error::Closed) => {}
                Err(e) => panic!("{name}: settle failed: {e}"),
            }
        }
    };
    let mut checked = 0;
    for (i, step) in v["steps"].as_array().unwrap().iter().enumerate() {
        if let Some(only) = step["only"].as_str() {
            if only != backend {
                continue;
            }
        }
        let ctx = format!("{name} [{backend}] step {i} {step}");
        let l = &limiters[step["instance"].as_u64().unwrap_or(0) as usize];
        let cost = step["cost"].as_u64().unwrap_or(1);
        let op = step["op"].as_str().unwrap();
        let expect_error = step["expect_error"].as_str();
        let tier = step["tier"].as_str();
        let store = |r: Result<u64, Error>| {
            match (r, expect_error) {
                (Ok(_), None) => {}
                (Err(e), Some(k)) => assert_eq!(kind_name(&e), k, "{ctx}: {e}"),
                (Ok(v), Some(k)) => panic!("{ctx}: expected error {k}, got version {v}"),
                (Err(e), None) => panic!("{ctx}: unexpected error {e}"),
            }
            None
        };
        let text = |f: &str| step[f].as_str().unwrap_or_else(|| panic!("{ctx}: {f} is a string"));
        let outcome: Option<Result<Decision, Error>> = match op {
            "acquire" => Some(l.acquire_with(&key_of(step), cost, tier)),
            "try_acquire" => Some(l.try_acquire_with(&key_of(step), cost, tier)),
            "policy_set_tier" => store(l.policy_set_tier(text("name"), text("rules"))),
            "policy_delete_tier" => store(l.policy_delete_tier(text("name"))),
            "policy_assign" => store(l.policy_assign(&key_of(step), text("assignment"))),
            "policy_unassign" => store(l.policy_unassign(&key_of(step))),
            "acquire_n" => {
                let (mut a, mut d) = (0u64, 0u64);
                for _ in 0..step["count"].as_u64().unwrap() {
                    if l.acquire_with(&key_of(step), cost, tier).unwrap().allowed {
                        a += 1
                    } else {
                        d += 1
                    }
                    settle(&limiters);
                }
                assert_eq!(serde_json::json!({"allowed": a, "denied": d}), step["expect"], "{ctx}");
                None
            }
            "advance" => {
                for l in &limiters {
                    l.advance_clock(step["ms"].as_u64().unwrap()).unwrap();
                }
                None
            }
            "settle" => None,
            "set_limit" => {
                let r = l.set_limit(
                    &key_of(step),
                    step["limit"].as_u64().unwrap(),
                    step["window_ms"].as_u64().unwrap(),
                );
                if let Some(k) = expect_error {
                    assert_eq!(kind_name(&r.unwrap_err()), k, "{ctx}");
                } else {
                    r.unwrap_or_else(|e| panic!("{ctx}: {e}"));
                }
                None
            }
            "flush" => {
                l.flush().unwrap_or_else(|e| panic!("{ctx}: {e}"));
                None
            }
            "close" => {
                l.close().unwrap_or_else(|e| panic!("{ctx}: {e}"));
                None
            }
            "metrics" => {
                check_metrics(&ctx, &l.metrics(), &step["expect"]);
                None
            }
            "new" => {
                let mut cfg = base.clone();
                for (k, v) in step["config"].as_object().unwrap() {
                    cfg.insert(k.clone(), v.clone());
                }
                let r = config_from(&cfg, &url, &ns).and_then(Limiter::new);
                assert_eq!(kind_name(&r.unwrap_err()), expect_error.unwrap(), "{ctx}");
                None
            }
            other => panic!("{ctx}: unknown op {other}"),
        };
        if let Some(r) = outcome {
            match (r, expect_error) {
                (Ok(d), None) => check_decision(&ctx, &d, &step["expect"]),
                (Err(e), Some(k)) => assert_eq!(kind_name(&e), k, "{ctx}: {e}"),
                (Ok(d), Some(k)) => panic!("{ctx}: expected error {k}, got {d:?}"),
                (Err(e), None) => panic!("{ctx}: unexpected error {e}"),
            }
        }
        settle(&limiters);
        checked += 1;
    }
    checked
}

fn vector_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/vectors");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 15, "expected at least 15 vectors in {}", dir.display());
    files
}

#[test]
fn vectors_memory() {
    let mut steps = 0;
    for f in vector_files() {
        steps += run_vector(&f, "memory", None);
    }
    assert!(steps > 100, "only {steps} steps ran");
}

#[test]
fn vectors_redis() {
    let server = common::redis_or_skip!(common::RedisServer::start());
    let mut steps = 0;
    for f in vector_files() {
        steps += run_vector(&f, "redis", Some(&server.url()));
    }
    assert!(steps > 100, "only {steps} steps ran");
}

#[test]
fn vectors_redis_cluster() {
    let cluster = common::redis_or_skip!(common::RedisCluster::start());
    let mut steps = 0;
    for f in vector_files() {
        // Same expectations as the standalone server: the scripts see one key each.
        steps += run_vector(&f, "redis", Some(&cluster.url()));
    }
    assert!(steps > 100, "only {steps} steps ran");
}

#[test]
fn vectors_redis_sentinel() {
    let group = common::redis_or_skip!(common::SentinelGroup::start());
    let mut steps = 0;
    for f in vector_files() {
        // The primary the sentinels name answers as a standalone server does.
        steps += run_vector(&f, "redis", Some(&group.url()));
    }
    assert!(steps > 100, "only {steps} steps ran");
}

#[test]
fn vectors_redis_as_a_restricted_user() {
    // docs/redis.md's "Redis permissions" rule (core/tests/acl.rs checks it against
    // the scripts), for the prefixes this runner uses (`v…`).
    let server = common::redis_or_skip!(common::RedisServer::start());
    let rule = "ACL SETUSER ql-vectors on >vec-pw resetkeys ~v* resetchannels -@all \
                +evalsha +eval +time +get +set +pttl +hgetall +hset +hdel +pexpire \
                +hlen +hmget +lrange +lpush +ltrim +type +del +hget +zadd +zrange +zrangebyscore \
                +zremrangebyscore +zscore +zrem";
    assert_eq!(server.cli(&rule.split(' ').collect::<Vec<_>>()), "OK");
    let url = format!("redis://ql-vectors:vec-pw@127.0.0.1:{}", server.port);
    let mut steps = 0;
    for f in vector_files() {
        steps += run_vector(&f, "redis", Some(&url));
    }
    assert!(steps > 100, "only {steps} steps ran");
}
