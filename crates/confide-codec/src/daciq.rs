//! dACIQ: analytical clipping threshold from each party's max, min and count
//! (algorithms.md §2.6), with the corrected table A(b) and the effective
//! per-party width b_eff = r − ⌈log2 m⌉.
//!
//! σ̂ = C·(M − μ)/sqrt(2 ln N), C = ½·0.35·(1 + sqrt(π ln 4)); α = A(b)·σ̂ where
//! A(b) minimises E(α) = (α² + 1)·erfc(α/√2) − sqrt(2/π)·α·e^(−α²/2) + 2α²(2^b − 2)/(3·2^(3b)).

use crate::bits::ceil_log2;
use crate::error::{invalid, Result};

/// ½ · 0.35 · (1 + sqrt(π · ln 4)).
pub const RANGE_TO_SIGMA: f64 = 0.540_208;

/// A(b) for b = 2..=32 (σ = 1), by bisection on E′(α) = 0 (the table of algorithms.md §2.6;
/// BatchCrypt's own table is wrong for b ≥ 20). `solve_alpha_factor` recomputes it.
pub const ALPHA_FACTORS: [f64; 31] = [
    1.7106, 2.0261, 2.3985, 2.7687, 3.1226, 3.4573, 3.7736, 4.0729, 4.3573, 4.6284, 4.8877, 5.1364, 5.3757, 5.6064, 5.8294, 6.0454, 6.2549,
    6.4585, 6.6567, 6.8497, 7.0381, 7.2220, 7.4019, 7.5779, 7.7502, 7.9191, 8.0848, 8.2475, 8.4072, 8.5642, 8.7186,
];

/// A(b) from the table.
///
/// # Errors
/// `InvalidParameter` unless 2 ≤ b ≤ 32.
pub fn alpha_factor(bits: u32) -> Result<f64> {
    if !(2..=32).contains(&bits) {
        return Err(invalid("bits", format!("dACIQ effective width must be in 2..=32, got {bits}")));
    }
    Ok(ALPHA_FACTORS[(bits - 2) as usize])
}

/// E′(α) for σ = 1 and b bits.
fn error_derivative(alpha: f64, bits: u32) -> f64 {
    let levels = 2f64.powi(bits as i32);
    2.0 * alpha * libm::erfc(alpha / std::f64::consts::SQRT_2) - 2.0 * (2.0 / std::f64::consts::PI).sqrt() * (-alpha * alpha / 2.0).exp()
        + 4.0 * alpha * (levels - 2.0) / (3.0 * levels * levels * levels)
}

/// A(b) by bisection (E′ < 0 below the optimum, > 0 above).
pub fn solve_alpha_factor(bits: u32) -> f64 {
    let (mut low, mut high) = (1e-6, 30.0);
    for _ in 0..200 {
        let middle = 0.5 * (low + high);
        if error_derivative(middle, bits) > 0.0 {
            high = middle;
        } else {
            low = middle;
        }
    }
    0.5 * (low + high)
}

/// σ̂ from the global range and the total element count N (≥ 2).
///
/// # Errors
/// `InvalidParameter` for N < 2 or a non-finite range.
pub fn sigma_from_range(max: f64, min: f64, count: u64) -> Result<f64> {
    if count < 2 {
        return Err(invalid("count", format!("dACIQ needs at least 2 elements, got {count}")));
    }
    if !(max.is_finite() && min.is_finite()) || max < min {
        return Err(invalid("max/min", format!("need finite max >= min, got max={max}, min={min}")));
    }
    Ok(RANGE_TO_SIGMA * (max - min) / (2.0 * (count as f64).ln()).sqrt())
}

/// The clipping threshold α for one layer.
///
/// `maxima`/`minima` hold each party's max and min of the layer, `elements` the
/// layer size d, `bits` the quantization width r, `parties` the number m of
/// summed parties; with `effective_bits` the table is read at r − ⌈log2 m⌉.
/// An all-constant layer (σ̂ = 0) gets α = max(|M|, |μ|), or 1 if that is 0.
///
/// # Errors
/// `InvalidParameter` for empty or unequal inputs, or out-of-range widths.
pub fn clipping_threshold(maxima: &[f64], minima: &[f64], elements: u64, bits: u32, parties: u32, effective_bits: bool) -> Result<f64> {
    if maxima.is_empty() || maxima.len() != minima.len() {
        return Err(invalid("maxima/minima", format!("need one max and one min per party, got {} and {}", maxima.len(), minima.len())));
    }
    let max = maxima.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min = minima.iter().copied().fold(f64::INFINITY, f64::min);
    let count = elements.saturating_mul(maxima.len() as u64);
    let sigma = sigma_from_range(max, min, count)?;
    let width = if effective_bits { bits.saturating_sub(ceil_log2(u64::from(parties.max(1)))) } else { bits };
    let alpha = alpha_factor(width)? * sigma;
    if alpha > 0.0 {
        return Ok(alpha);
    }
    let magnitude = max.abs().max(min.abs());
    Ok(if magnitude > 0.0 { magnitude } else { 1.0 })
}
