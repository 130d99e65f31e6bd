//! Which key each request of `quotalease bench` uses: the offered load,
//! generated once per run so every strategy sees the same key sequence on
//! each thread.

use crate::rng::Rng;

/// Exponent of the Zipf spread (`--dist zipf`).
pub const ZIPF_S: f64 = 1.1;

/// How requests spread over the keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Dist {
    /// Each thread walks all keys in turn, starting at its own offset.
    RoundRobin,
    /// Every request on one key.
    Hot,
    /// Zipf (s = 1.1) over the keys: key rank r gets a share proportional to 1/r^1.1.
    Zipf,
}

impl Dist {
    /// The name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Dist::RoundRobin => "round-robin",
            Dist::Hot => "hot",
            Dist::Zipf => "zipf",
        }
    }

    /// Keys a run touches, given `--keys`.
    pub fn keys(self, keys: u64) -> u64 {
        match self {
            Dist::Hot => 1,
            _ => keys,
        }
    }

    /// A line saying what the load is.
    pub fn describe(self, keys: u64) -> String {
        match self {
            Dist::RoundRobin => format!("round-robin over {keys} keys"),
            Dist::Hot => "one hot key".to_string(),
            Dist::Zipf => format!("Zipf s={ZIPF_S} over {keys} keys"),
        }
    }
}

/// One thread's key indices, replayed in a loop.
#[derive(Clone, Debug)]
pub enum KeySeq {
    /// Key `(start + i) % keys` for request `i`.
    RoundRobin {
        /// First key.
        start: u64,
        /// Keys.
        keys: u64,
    },
    /// Precomputed indices, cycled.
    Fixed(Vec<u32>),
}

impl KeySeq {
    /// The key index of request `i`.
    #[inline]
    pub fn at(&self, i: u64) -> usize {
        match self {
            KeySeq::RoundRobin { start, keys } => ((start + i) % keys) as usize,
            KeySeq::Fixed(v) => v[(i % v.len() as u64) as usize] as usize,
        }
    }
}

/// Length of a precomputed Zipf sequence per thread (about 8 MB in all at most).
fn zipf_len(threads: usize) -> usize {
    ((1usize << 21) / threads.max(1)).clamp(4096, 65_536)
}

/// Cumulative Zipf(s) probabilities over `n` ranks.
fn zipf_cdf(n: u64, s: f64) -> Vec<f64> {
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = (1..=n)
        .map(|r| {
            acc += (r as f64).powf(-s);
            acc
        })
        .collect();
    for c in &mut cdf {
        *c /= acc;
    }
    cdf
}

/// Every thread's key sequence for `dist` over `keys` keys (`keys` at most
/// 2^32), deterministic in `seed`.
pub fn sequences(dist: Dist, keys: u64, threads: usize, seed: u64) -> Vec<KeySeq> {
    let keys = dist.keys(keys).max(1);
    match dist {
        Dist::RoundRobin => (0..threads)
            .map(|t| KeySeq::RoundRobin {
                start: t as u64 % keys,
                keys,
            })
            .collect(),
        Dist::Hot => (0..threads).map(|_| KeySeq::RoundRobin { start: 0, keys: 1 }).collect(),
        Dist::Zipf => {
            let cdf = zipf_cdf(keys, ZIPF_S);
            let len = zipf_len(threads);
            (0..threads)
                .map(|t| {
                    let mut rng = Rng::new(seed, t as u64);
                    let v = (0..len)
                        .map(|_| {
                            let u = rng.unit();
                            cdf.partition_point(|c| *c <= u).min(keys as usize - 1) as u32
                        })
                        .collect();
                    KeySeq::Fixed(v)
                })
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(seqs: &[KeySeq], keys: usize, n: u64) -> Vec<u64> {
        let mut c = vec![0u64; keys];
        for s in seqs {
            for i in 0..n {
                c[s.at(i)] += 1;
            }
        }
        c
    }

    #[test]
    fn hot_is_one_key_and_round_robin_walks_all() {
        let hot = sequences(Dist::Hot, 50, 3, 1);
        assert_eq!(counts(&hot, 1, 10), vec![30]);
        let rr = sequences(Dist::RoundRobin, 4, 6, 1);
        assert_eq!(counts(&rr, 4, 8), vec![12; 4]);
        assert_eq!(rr[5].at(0), 1);
    }

    #[test]
    fn zipf_is_deterministic_and_skewed() {
        let a = sequences(Dist::Zipf, 1000, 4, 7);
        let b = sequences(Dist::Zipf, 1000, 4, 7);
        let c = sequences(Dist::Zipf, 1000, 4, 8);
        let take = |s: &[KeySeq]| -> Vec<usize> { s.iter().flat_map(|q| (0..100).map(|i| q.at(i))).collect() };
        assert_eq!(take(&a), take(&b));
        assert_ne!(take(&a), take(&c));
        assert_ne!(take(&a[..1]), take(&a[1..2]), "threads get their own streams");
        let n = 65_536;
        let got = counts(&a, 1000, n);
        let total = (4 * n) as f64;
        let cdf = zipf_cdf(1000, ZIPF_S);
        // Rank 1 and rank 2 shares within 2 % (absolute) of the distribution's.
        assert!((got[0] as f64 / total - cdf[0]).abs() < 0.02, "{}", got[0]);
        assert!((got[1] as f64 / total - (cdf[1] - cdf[0])).abs() < 0.02, "{}", got[1]);
        assert!(got[0] > got[9] && got[9] > got[99]);
    }

    #[test]
    fn zipf_over_two_keys_stays_in_range() {
        let s = sequences(Dist::Zipf, 2, 1, 1);
        let c = counts(&s, 2, 10_000);
        assert!(c[0] > c[1] && c[1] > 0, "{c:?}");
    }
}
