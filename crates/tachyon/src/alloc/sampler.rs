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
///
/// The uniform is `u = v / 2^53` for `v` = 53 random bits + 1 (in `(0, 1]`: ln 0 is infinite),
/// and `-ln u` is taken from `u`'s exponent and mantissa, which come from `v` by a count of
/// leading zeros and shifts: the same bits a conversion to `f64` would give (`v` fits in its
/// 53-bit significand), without the conversions' latency (this runs once per sample, on the
/// allocating thread, as one chain of dependent operations). The conversions left go through
/// `i64`: every value here fits in 63 bits (an interval below 2^62; a gap below 37 intervals,
/// as `-ln u` is below 37), and x86-64 converts signed integers in one instruction where
/// unsigned ones take a branch and a fix-up.
pub(crate) fn next_gap(state: &mut u64, interval: u64) -> u64 {
    let v = (next(state) >> 11) + 1;
    let lz = v.leading_zeros();
    // `u = 2^(63 - lz - 53) × 1.mantissa`: the bits after `v`'s leading one, left-aligned.
    let mantissa = ((v << lz) << 1) >> 12;
    let mean = interval.min(1 << 62) as i64 as f64;
    // `as i64` saturates (a gap never comes near).
    ((neg_ln_parts(10 - i64::from(lz), mantissa) * mean) as i64).max(1) as u64
}

/// `ln(1 + x) / x` on `[√½ − 1, √2 − 1]`: a degree-9 least-squares fit (coefficients of
/// `x^0..x^9`); `x` times it is `ln(1 + x)` within 1.5e-9 over the range.
const LN1P_OVER_X: [f64; 10] = [
    1.000_000_000_018_215_4,
    -0.499_999_882_941_419_5,
    0.333_333_240_236_385,
    -0.250_015_851_230_443,
    0.200_020_716_748_231_55,
    -0.166_091_265_049_719_72,
    0.141_800_787_180_746_6,
    -0.132_408_426_926_680_12,
    0.129_141_703_276_391_35,
    -0.076_385_924_575_260_47,
];

/// `-ln(u)` for `u` in `(0, 1]` (a normal number), without a libm call ([`neg_ln_parts`] of
/// its exponent and mantissa bits).
#[cfg(test)]
fn neg_ln(u: f64) -> f64 {
    let bits = u.to_bits();
    neg_ln_parts(((bits >> 52) & 0x7ff) as i64 - 1023, bits & MANTISSA)
}

const MANTISSA: u64 = (1 << 52) - 1;

/// `-ln(2^e × 1.mantissa)` (`mantissa`: the 52 bits of an `f64`'s): with `m` in `[√½, √2)`
/// (the mantissa halved when above √2, compared as bits), and `ln m` from [`LN1P_OVER_X`]. The
/// error (below 2e-9 absolute) is far under what a byte count can show: a gap of `interval` ×
/// this.
#[inline]
fn neg_ln_parts(mut e: i64, mantissa: u64) -> f64 {
    let (exponent, carry) = if mantissa > std::f64::consts::SQRT_2.to_bits() & MANTISSA {
        (1022, 1)
    } else {
        (1023, 0)
    };
    e += carry;
    let m = f64::from_bits(mantissa | exponent << 52);
    let x = m - 1.0;
    // Estrin's scheme: pairs, then quads, then the whole, so the chain of dependent
    // multiply-adds is four long instead of Horner's nine (this runs once per sample, on the
    // allocating thread).
    let c = &LN1P_OVER_X;
    let x2 = x * x;
    let x4 = x2 * x2;
    let p01 = c[0] + c[1] * x;
    let p23 = c[2] + c[3] * x;
    let p45 = c[4] + c[5] * x;
    let p67 = c[6] + c[7] * x;
    let p89 = c[8] + c[9] * x;
    let p03 = p01 + p23 * x2;
    let p47 = p45 + p67 * x2;
    let p = p03 + (p47 + p89 * x4) * x4;
    -(e as f64 * std::f64::consts::LN_2 + x * p)
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
    #[cfg_attr(
        miri,
        ignore = "370 000 logarithms: slow under Miri, no unsafe code involved"
    )]
    fn neg_ln_matches_libm() {
        let mut worst = 0f64;
        let mut u = 1.0f64;
        // From 1 down to 2^-53, in steps that visit every part of the mantissa's range.
        while u >= 1.0 / (1u64 << 53) as f64 {
            let err = (neg_ln(u) - -u.ln()).abs();
            worst = worst.max(err);
            u *= 0.999_9;
        }
        assert!(worst < 2e-9, "worst error {worst:e}");
        assert_eq!(neg_ln(1.0), 0.0);
    }

    /// The gaps are those of the uniform converted to `f64` the plain way (`v as f64 / 2^53`),
    /// bit for bit.
    #[test]
    fn gaps_take_the_uniforms_bits_as_a_conversion_would() {
        let n = if cfg!(miri) { 200 } else { 100_000 };
        for interval in [1, 4096, 1 << 40] {
            let (mut a, mut b) = (thread_seed(9, 1), thread_seed(9, 1));
            for _ in 0..n {
                let got = next_gap(&mut a, interval);
                let u = ((next(&mut b) >> 11) + 1) as f64 / (1u64 << 53) as f64;
                let want = ((neg_ln(u) * interval as f64) as i64).max(1) as u64;
                assert_eq!(got, want, "u {u}");
            }
        }
        // The ends: u = 1 (the largest draw, a gap of at least 1) and u = 2^-53.
        assert_eq!(neg_ln_parts(0, 0), 0.0);
        assert!((neg_ln_parts(-53, 0) - 53.0 * std::f64::consts::LN_2).abs() < 1e-8);
    }

    #[test]
    fn seeds_differ_per_thread_and_repeat_per_seed() {
        assert_ne!(thread_seed(1, 0), thread_seed(1, 1));
        assert_eq!(thread_seed(7, 3), thread_seed(7, 3));
    }
}
