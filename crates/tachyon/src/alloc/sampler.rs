//! The random part of sampled mode: exponential gaps between samples (a Poisson process over
//! allocated bytes), from a per-thread xorshift generator. No allocation, no locks.

/// A thread's seed: the session's seed mixed with the thread's arrival number.
pub(crate) fn thread_seed(seed: u64, thread: u64) -> u64 {
    let s = crate::track_event::global::mix64(seed ^ thread.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    if s == 0 {
        0x2545_f491_4f6c_dd1d
    } else {
        s
    }
}

/// xorshift64*: the next value.
fn next(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Bytes to the next sample: an exponential draw with mean `interval`, at least 1.
pub(crate) fn next_gap(state: &mut u64, interval: u64) -> u64 {
    // A uniform in (0, 1]: 53 random bits, never 0 (ln 0 is infinite).
    let u = ((next(state) >> 11) + 1) as f64 / (1u64 << 53) as f64;
    let gap = -u.ln() * interval as f64;
    (gap as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(
        miri,
        ignore = "200 000 draws: slow under Miri, no unsafe code involved"
    )]
    fn gaps_have_the_mean_asked_for() {
        let mut s = thread_seed(42, 0);
        let n = 200_000;
        let sum: u64 = (0..n).map(|_| next_gap(&mut s, 4096)).sum();
        let mean = sum as f64 / n as f64;
        // Standard error of the mean: 4096 / sqrt(n) ≈ 9; allow 6 of them.
        assert!((mean - 4096.0).abs() < 60.0, "mean {mean}");
    }

    #[test]
    fn seeds_differ_per_thread_and_repeat_per_seed() {
        assert_ne!(thread_seed(1, 0), thread_seed(1, 1));
        assert_eq!(thread_seed(7, 3), thread_seed(7, 3));
    }
}
