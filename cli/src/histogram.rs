//! A log-linear latency histogram (about 3 % resolution, fixed memory), for
//! p50/p99 without keeping every sample.

const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

/// Counts of nanosecond values.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Vec<u64>,
    n: u64,
    sum: u128,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            n: 0,
            sum: 0,
            max: 0,
        }
    }
}

fn index(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let p = 63 - v.leading_zeros();
    let shift = p - SUB_BITS;
    let sub = (v >> shift) & (SUB - 1);
    ((p - SUB_BITS + 1) as u64 * SUB + sub) as usize
}

fn upper(i: usize) -> u64 {
    let i = i as u64;
    if i < 2 * SUB {
        return i;
    }
    let p = i / SUB + SUB_BITS as u64 - 1;
    let shift = p - SUB_BITS as u64;
    let lower = (SUB + i % SUB) << shift;
    lower + ((1u64 << shift) - 1)
}

impl Histogram {
    /// Record one value (ns).
    pub fn record(&mut self, v: u64) {
        self.counts[index(v)] += 1;
        self.n += 1;
        self.sum += v as u128;
        self.max = self.max.max(v);
    }

    /// Add another histogram's counts.
    pub fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.n += o.n;
        self.sum += o.sum;
        self.max = self.max.max(o.max);
    }

    /// Values recorded.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Mean (ns), 0 when empty.
    pub fn mean(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum as f64 / self.n as f64
        }
    }

    /// The value at quantile `q` in [0, 1] (upper edge of its bucket, at most the max).
    pub fn quantile(&self, q: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return upper(i).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_tight() {
        let mut last = 0;
        for v in (0..200_000u64).chain([u64::MAX / 3, u64::MAX]) {
            let i = index(v);
            assert!(i >= last && i < BUCKETS, "{v}");
            assert!(upper(i) >= v, "{v} above its bucket's upper edge {}", upper(i));
            assert!(upper(i) - v <= v / 16, "bucket of {v} too wide");
            last = i;
        }
    }

    #[test]
    fn quantiles() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.5), 0);
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5) as f64;
        let p99 = h.quantile(0.99) as f64;
        assert!((p50 / 500_000.0 - 1.0).abs() < 0.04, "{p50}");
        assert!((p99 / 990_000.0 - 1.0).abs() < 0.04, "{p99}");
        assert_eq!(h.quantile(1.0), 1_000_000);
        assert_eq!(h.len(), 1000);
        assert!((h.mean() - 500_500.0).abs() < 1.0);
    }
}
