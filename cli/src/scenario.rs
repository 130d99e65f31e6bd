//! The demo's scenario as a deterministic event list: instances starting,
//! stopping and going idle behind a load balancer that spreads each key
//! unevenly, and the requests of three keys.

use std::collections::BTreeSet;
use std::f64::consts::TAU;

use crate::rng::Rng;

/// The knobs that shape the traffic.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// Most instances running at once.
    pub instances: u64,
    /// Tokens per window for every key.
    pub limit: u64,
    /// Window (ms).
    pub window_ms: u64,
    /// Load-balancer skew: instance of rank r gets weight 1 / (r + 1)^skew (0: even).
    pub skew: f64,
    /// Length of the run (ms).
    pub duration_ms: u64,
    /// Seed of every random choice.
    pub seed: u64,
}

/// One key of the scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct KeySpec {
    /// The key.
    pub name: &'static str,
    /// What its traffic looks like, for the report.
    pub about: &'static str,
    /// Mean demand as a multiple of the limit's rate.
    pub base: f64,
    /// Relative swing of the demand (a sine over a third of the run).
    pub swing: f64,
}

impl KeySpec {
    /// Demand at `t` in requests per ms.
    pub fn rate_at(&self, shape: &Shape, t: u64) -> f64 {
        let limit_rate = shape.limit as f64 / shape.window_ms as f64;
        let period = (shape.duration_ms as f64 / 3.0).max(1.0);
        limit_rate * self.base * (1.0 + self.swing * (TAU * t as f64 / period).sin())
    }

    fn peak_rate(&self, shape: &Shape) -> f64 {
        shape.limit as f64 / shape.window_ms as f64 * self.base * (1.0 + self.swing.abs())
    }
}

/// The three keys of the demo, all with the same limit.
pub fn keys() -> Vec<KeySpec> {
    vec![
        KeySpec {
            name: "steady",
            about: "stays under its limit: 0.7x of it, swinging by 0.25x",
            base: 0.7,
            swing: 0.25 / 0.7,
        },
        KeySpec {
            name: "whale",
            about: "asks for 10x its limit",
            base: 10.0,
            swing: 0.0,
        },
        KeySpec {
            name: "quiet",
            about: "asks for 5% of its limit",
            base: 0.05,
            swing: 0.0,
        },
    ]
}

/// What happens at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A new instance starts (empty leases).
    Start(u32),
    /// An instance stops: gracefully (gives its leases back) or killed.
    Stop {
        /// The instance.
        id: u32,
        /// `close()` (true) or SIGKILL (false: its leased tokens are lost).
        graceful: bool,
    },
    /// The load balancer stops sending this instance traffic; it keeps running.
    Idle(u32),
    /// The load balancer sends this instance traffic again.
    Busy(u32),
    /// One request for `key` (index into [`keys`]) lands on `instance`.
    Request {
        /// Key index.
        key: usize,
        /// Instance that serves it.
        instance: u32,
    },
}

/// An event at `t` ms from the start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// Milliseconds from the start of the run.
    pub t: u64,
    /// What happens.
    pub kind: Kind,
}

/// A stretch of the run with a fixed fleet, for the report and the chart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Phase {
    /// Start (ms).
    pub start: u64,
    /// Instances running.
    pub running: usize,
    /// Instances the load balancer sends nothing.
    pub idle: usize,
    /// What changed.
    pub label: String,
}

/// The whole run: keys, events in time order, phases.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The knobs.
    pub shape: Shape,
    /// The keys.
    pub keys: Vec<KeySpec>,
    /// Every event, in time order.
    pub events: Vec<Event>,
    /// Fleet phases.
    pub phases: Vec<Phase>,
    /// Requests per key.
    pub requests: Vec<u64>,
    /// Most instances running at once.
    pub max_running: u64,
}

impl Scenario {
    /// Build the scenario for `shape`. The fleet: `instances - 2` start; at 20 %
    /// of the run it scales out to `instances`; from 40 % to 55 % one instance
    /// gets no traffic while it keeps its leases; at 60 % it scales in to half
    /// (the first instance to go is killed, the others stop gracefully); at 80 %
    /// it scales out again.
    pub fn build(shape: &Shape) -> Scenario {
        let n = shape.instances.max(1) as u32;
        let d = shape.duration_ms;
        let at = |pct: u64| d * pct / 100;
        let start_n = n.saturating_sub(2).max(1);
        let in_n = (n / 2).max(1);
        let mut fleet: Vec<Event> = Vec::new();
        let mut phases = Vec::new();
        let mut next_id = 0u32;
        let mut running: Vec<u32> = Vec::new();
        let mut start = |t: u64, upto: u32, fleet: &mut Vec<Event>, running: &mut Vec<u32>| {
            while running.len() < upto as usize {
                fleet.push(Event {
                    t,
                    kind: Kind::Start(next_id),
                });
                running.push(next_id);
                next_id += 1;
            }
        };
        start(0, start_n, &mut fleet, &mut running);
        phases.push(Phase {
            start: 0,
            running: running.len(),
            idle: 0,
            label: format!("{} running", running.len()),
        });
        if n > start_n {
            start(at(20), n, &mut fleet, &mut running);
            phases.push(Phase {
                start: at(20),
                running: running.len(),
                idle: 0,
                label: format!("scale out to {}", running.len()),
            });
        }
        if running.len() >= 2 {
            let id = running[1];
            fleet.push(Event {
                t: at(40),
                kind: Kind::Idle(id),
            });
            fleet.push(Event {
                t: at(55),
                kind: Kind::Busy(id),
            });
            phases.push(Phase {
                start: at(40),
                running: running.len(),
                idle: 1,
                label: format!("instance {id} idle, holding its leases"),
            });
            phases.push(Phase {
                start: at(55),
                running: running.len(),
                idle: 0,
                label: format!("instance {id} busy again"),
            });
        }
        if (running.len() as u32) > in_n {
            let mut first = true;
            while running.len() > in_n as usize {
                let id = running.pop().unwrap_or_default();
                fleet.push(Event {
                    t: at(60),
                    kind: Kind::Stop { id, graceful: !first },
                });
                first = false;
            }
            phases.push(Phase {
                start: at(60),
                running: running.len(),
                idle: 0,
                label: format!("scale in to {} (one killed)", running.len()),
            });
            start(at(80), n, &mut fleet, &mut running);
            phases.push(Phase {
                start: at(80),
                running: running.len(),
                idle: 0,
                label: format!("scale out to {}", running.len()),
            });
        }

        let keys = keys();
        // Request times per key: a Poisson process with a time-varying rate (thinning).
        let mut times: Vec<(u64, usize)> = Vec::new();
        let mut requests = vec![0u64; keys.len()];
        for (k, spec) in keys.iter().enumerate() {
            let mut rng = Rng::new(shape.seed, 1 + k as u64);
            let peak = spec.peak_rate(shape);
            if peak <= 0.0 {
                continue;
            }
            let mut t = 0.0f64;
            loop {
                t += rng.exp(1.0 / peak);
                if t >= d as f64 {
                    break;
                }
                let ms = t as u64;
                if rng.unit() * peak < spec.rate_at(shape, ms) {
                    times.push((ms, k));
                    requests[k] += 1;
                }
            }
        }
        times.sort_unstable();

        // Route each request: fleet changes at an instant apply before its requests.
        let mut events = Vec::with_capacity(fleet.len() + times.len());
        let mut route = Rng::new(shape.seed, 0);
        let mut live: BTreeSet<u32> = BTreeSet::new();
        let mut idle: BTreeSet<u32> = BTreeSet::new();
        let mut fi = 0;
        let mut weights: Vec<(u32, f64)> = Vec::new();
        for (t, key) in times {
            while fi < fleet.len() && fleet[fi].t <= t {
                let ev = fleet[fi];
                match ev.kind {
                    Kind::Start(id) => {
                        live.insert(id);
                    }
                    Kind::Stop { id, .. } => {
                        live.remove(&id);
                        idle.remove(&id);
                    }
                    Kind::Idle(id) => {
                        idle.insert(id);
                    }
                    Kind::Busy(id) => {
                        idle.remove(&id);
                    }
                    Kind::Request { .. } => {}
                }
                events.push(ev);
                fi += 1;
            }
            let serving: Vec<u32> = live.iter().copied().filter(|id| !idle.contains(id)).collect();
            weights.clear();
            let m = serving.len();
            for (pos, id) in serving.iter().enumerate() {
                // Each key has its own favourite instances: rotate the ranks by key.
                let rank = (pos + key * 2) % m;
                weights.push((*id, 1.0 / ((rank + 1) as f64).powf(shape.skew)));
            }
            let total: f64 = weights.iter().map(|w| w.1).sum();
            let mut pick = route.unit() * total;
            let mut instance = weights[m - 1].0;
            for (id, w) in &weights {
                if pick < *w {
                    instance = *id;
                    break;
                }
                pick -= w;
            }
            events.push(Event {
                t,
                kind: Kind::Request { key, instance },
            });
        }
        events.extend_from_slice(&fleet[fi..]);
        Scenario {
            shape: shape.clone(),
            keys,
            events,
            phases,
            requests,
            max_running: n as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            instances: 6,
            limit: 600,
            window_ms: 60_000,
            skew: 1.0,
            duration_ms: 300_000,
            seed: 1,
        }
    }

    #[test]
    fn deterministic_for_a_seed() {
        let a = Scenario::build(&shape());
        let b = Scenario::build(&shape());
        assert_eq!(a.events, b.events);
        let c = Scenario::build(&Shape { seed: 2, ..shape() });
        assert_ne!(a.events, c.events);
    }

    #[test]
    fn events_are_ordered_and_requests_land_on_serving_instances() {
        let s = Scenario::build(&shape());
        let mut live = BTreeSet::new();
        let mut idle = BTreeSet::new();
        let mut most = 0;
        let mut last = 0;
        for e in &s.events {
            assert!(e.t >= last);
            last = e.t;
            match e.kind {
                Kind::Start(id) => assert!(live.insert(id)),
                Kind::Stop { id, .. } => assert!(live.remove(&id)),
                Kind::Idle(id) => assert!(idle.insert(id)),
                Kind::Busy(id) => assert!(idle.remove(&id)),
                Kind::Request { instance, .. } => {
                    assert!(live.contains(&instance) && !idle.contains(&instance));
                }
            }
            most = most.max(live.len());
        }
        assert_eq!(most, 6);
        // Demand: about 0.7x, 10x and 0.05x of 600/min over 5 minutes.
        let r = &s.requests;
        assert!((1900..2300).contains(&r[0]), "{r:?}");
        assert!((29_000..31_000).contains(&r[1]), "{r:?}");
        assert!((100..200).contains(&r[2]), "{r:?}");
    }

    #[test]
    fn one_instance_has_no_scaling() {
        let s = Scenario::build(&Shape {
            instances: 1,
            ..shape()
        });
        assert!(s
            .events
            .iter()
            .all(|e| matches!(e.kind, Kind::Start(0) | Kind::Request { instance: 0, .. })));
    }
}
