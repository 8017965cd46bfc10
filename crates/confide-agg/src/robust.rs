//! Robust rules inside the enclave of a `tee_f32_stack` round.
//!
//! In `plain` the aggregator's Python side applies a robust strategy to the stacked updates
//! (`python/confide/aggregator/robust.py`); under `tee` only the enclave may read them, so the
//! rules run here and only their estimates leave the enclave (sealed under the session key).
//!
//! * Coordinate-wise rules (median, trimmed mean) run on the opened m × n block of a slice as it
//!   completes ([`Rule::combine`]).
//! * Whole-update rules (Krum, Multi-Krum, norm clipping) weigh each update by its distances to
//!   the others or its norm over every slice of the round: as a slice completes, the enclave
//!   seals its block under a key only it holds and hands it to the host to hold; once every
//!   slice is in, the host hands them back ([`crate::Enclave::finish_robust`]), and the enclave
//!   opens them, adds up the Gram matrix of the updates, decides the weights ([`Rule::weights`])
//!   and seals each slice's weighted sum. The host holds m times the share's bytes, sealed.
//!
//! Every rule gives what `confide.ml.strategies` gives on the same updates: numpy's median (the
//! mean of the two middle values for an even m), the mean of the middle `m − 2·cut` values, Krum's
//! lowest score (a stable sort), norms scaled to the bound or the median norm; sums in f64,
//! rounded once to f32.

use crate::error::{invalid, Result};

/// A robust rule the enclave applies to the participants' updates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rule {
    /// The coordinate-wise median.
    Median,
    /// The mean of each coordinate without its `cut` largest and `cut` smallest values.
    TrimmedMean {
        /// Values dropped at each end of a coordinate.
        cut: u32,
    },
    /// The mean of the `selected` updates of lowest Krum score (Krum: 1).
    Krum {
        /// f, the malicious updates tolerated (2f + 2 < m).
        byzantine: u32,
        /// Updates averaged.
        selected: u32,
    },
    /// Each update scaled down to an L2 bound (None: the round's median norm), then the mean.
    NormClip {
        /// The bound, or None.
        bound: Option<f64>,
    },
}

impl Rule {
    /// The rule named `rule` with its options (`cut` for trimmed_mean, `byzantine` and `selected`
    /// for krum and multi_krum, `norm_bound` for norm_clip: 0 for the median norm).
    ///
    /// # Errors
    /// `InvalidParameter` naming the field: an unknown rule, an option past its limit for
    /// `participants` updates, fewer than 3 participants.
    pub fn parse(rule: &str, cut: u32, byzantine: u32, selected: u32, norm_bound: f64, participants: u32) -> Result<Self> {
        if participants < 3 {
            return Err(invalid("robust", format!("a robust rule needs at least 3 participants, got {participants}")));
        }
        let m = u64::from(participants);
        match rule {
            "median" => Ok(Rule::Median),
            "trimmed_mean" if cut >= 1 && 2 * u64::from(cut) < m => Ok(Rule::TrimmedMean { cut }),
            "trimmed_mean" => Err(invalid(
                "robust",
                format!("trimmed_mean must cut at least 1 value at each end and leave one of {participants}, got a cut of {cut}"),
            )),
            "krum" | "multi_krum" if 2 * u64::from(byzantine) + 2 >= m => {
                Err(invalid("robust", format!("{rule} needs 2f + 2 < m: f = {byzantine} is too large for {participants} participants")))
            }
            "krum" => Ok(Rule::Krum { byzantine, selected: 1 }),
            "multi_krum" if selected > participants => {
                Err(invalid("robust", format!("multi_krum selects {selected} of {participants} updates")))
            }
            "multi_krum" => Ok(Rule::Krum { byzantine, selected: if selected == 0 { participants - byzantine } else { selected } }),
            "norm_clip" if norm_bound.is_nan() || norm_bound < 0.0 || norm_bound.is_infinite() => {
                Err(invalid("robust", format!("norm_clip's bound must be finite and > 0 (0: the median norm), got {norm_bound}")))
            }
            "norm_clip" => Ok(Rule::NormClip { bound: (norm_bound > 0.0).then_some(norm_bound) }),
            other => Err(invalid("robust", format!("must be median, trimmed_mean, krum, multi_krum or norm_clip, got {other:?}"))),
        }
    }

    /// Whether the rule weighs whole updates (every slice of the round) rather than one coordinate.
    pub fn whole_update(self) -> bool {
        matches!(self, Rule::Krum { .. } | Rule::NormClip { .. })
    }

    /// Coordinate-wise rules: the estimate of each of the `block.len() / participants`
    /// coordinates of a row-major participants × n block of finite values. Whole-update rules:
    /// the plain mean (they are applied through [`Rule::weights`] instead).
    pub fn combine(self, block: &[f32], participants: usize) -> Vec<f32> {
        let n = block.len() / participants;
        let mut column = vec![0f32; participants];
        let mut out = Vec::with_capacity(n);
        for j in 0..n {
            for (p, value) in column.iter_mut().enumerate() {
                *value = block[p * n + j];
            }
            column.sort_unstable_by(f32::total_cmp);
            let kept = match self {
                Rule::Median if participants % 2 == 1 => &column[participants / 2..participants / 2 + 1],
                Rule::Median => &column[participants / 2 - 1..participants / 2 + 1],
                Rule::TrimmedMean { cut } => &column[cut as usize..participants - cut as usize],
                _ => &column[..],
            };
            out.push((kept.iter().map(|&v| f64::from(v)).sum::<f64>() / kept.len() as f64) as f32);
        }
        column.iter_mut().for_each(|v| *v = 0.0); // an update's values do not outlive the call
        out
    }

    /// Whole-update rules: each update's weight from the m × m Gram matrix `G_ij = <x_i, x_j>`
    /// (row-major). Coordinate-wise rules: 1/m each.
    pub fn weights(self, gram: &[f64], m: usize) -> Vec<f64> {
        match self {
            Rule::Krum { byzantine, selected } => {
                let nearest = m.saturating_sub(byzantine as usize + 2).max(1);
                let scores: Vec<f64> = (0..m)
                    .map(|i| {
                        let mut d: Vec<f64> = (0..m)
                            .filter(|&j| j != i)
                            .map(|j| (gram[i * m + i] + gram[j * m + j] - 2.0 * gram[i * m + j]).max(0.0))
                            .collect();
                        d.sort_unstable_by(f64::total_cmp);
                        d[..nearest.min(d.len())].iter().sum()
                    })
                    .collect();
                let mut order: Vec<usize> = (0..m).collect();
                order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b])); // stable: ties keep the lower index
                let k = (selected as usize).clamp(1, m);
                let mut out = vec![0.0; m];
                order[..k].iter().for_each(|&i| out[i] = 1.0 / k as f64);
                out
            }
            Rule::NormClip { bound } => {
                let norms: Vec<f64> = (0..m).map(|i| gram[i * m + i].max(0.0).sqrt()).collect();
                let bound = bound.unwrap_or_else(|| {
                    let mut sorted = norms.clone();
                    sorted.sort_unstable_by(f64::total_cmp);
                    if m % 2 == 1 {
                        sorted[m / 2]
                    } else {
                        (sorted[m / 2 - 1] + sorted[m / 2]) / 2.0
                    }
                });
                norms.iter().map(|&n| if n > bound { bound / n.max(1e-300) } else { 1.0 } / m as f64).collect()
            }
            _ => vec![1.0 / m as f64; m],
        }
    }
}

/// Adds a participants × n block's contribution to the Gram matrix (m × m, row-major).
pub fn add_gram(gram: &mut [f64], block: &[f32], m: usize) {
    let n = block.len() / m;
    for i in 0..m {
        for j in i..m {
            let dot: f64 =
                block[i * n..(i + 1) * n].iter().zip(&block[j * n..(j + 1) * n]).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
            gram[i * m + j] += dot;
            if i != j {
                gram[j * m + i] += dot;
            }
        }
    }
}

/// The weighted sum of a block's rows: `Σ_i w_i x_i`, rounded once to f32.
pub fn weighted(block: &[f32], weights: &[f64]) -> Vec<f32> {
    let m = weights.len();
    let n = block.len() / m;
    (0..n).map(|j| weights.iter().enumerate().map(|(i, &w)| w * f64::from(block[i * n + j])).sum::<f64>() as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts_and_trimmed_mean_drop_the_extremes() {
        // 3 participants x 2 coordinates, row-major: one outlier per column
        let block = [1.0, -5.0, 100.0, 2.0, 3.0, 4.0];
        assert_eq!(Rule::Median.combine(&block, 3), vec![3.0, 2.0]);
        let four = [1.0, 2.0, 10.0, 4.0];
        assert_eq!(Rule::Median.combine(&four, 4), vec![3.0]);
        let five = [1.0, 2.0, 3.0, 1000.0, -1000.0];
        assert_eq!(Rule::TrimmedMean { cut: 1 }.combine(&five, 5), vec![2.0]);
    }

    #[test]
    fn krum_keeps_the_clustered_updates_and_norm_clip_scales_the_long_one() {
        // five updates of 2 values (participants x n, row-major): four near (1, 1), one at (100, -100)
        let by_rows: Vec<f32> = [[1.0, 1.0], [1.1, 0.9], [0.9, 1.1], [1.0, 1.2], [100.0, -100.0]].iter().flatten().copied().collect();
        let mut gram = vec![0.0; 25];
        add_gram(&mut gram, &by_rows, 5);
        let krum = Rule::parse("krum", 0, 1, 0, 0.0, 5).unwrap().weights(&gram, 5);
        assert_eq!(krum.iter().filter(|&&w| w == 1.0).count(), 1);
        assert_eq!(krum[4], 0.0);
        let multi = Rule::parse("multi_krum", 0, 1, 0, 0.0, 5).unwrap().weights(&gram, 5);
        assert_eq!(multi, vec![0.25, 0.25, 0.25, 0.25, 0.0]);
        let clip = Rule::parse("norm_clip", 0, 0, 0, 0.0, 5).unwrap().weights(&gram, 5);
        assert!(clip[4] < 0.003 && (clip[0] - 0.2).abs() < 1e-12, "{clip:?}");
        let estimate = weighted(&by_rows, &multi);
        assert!((estimate[0] - 1.0).abs() < 0.01 && (estimate[1] - 1.05).abs() < 0.01, "{estimate:?}");
    }

    #[test]
    fn parse_refuses_what_cannot_run_naming_the_field() {
        for (rule, cut, f, k, bound, m) in [
            ("trimmed_mean", 2, 0, 0, 0.0, 4),
            ("trimmed_mean", 0, 0, 0, 0.0, 5),
            ("median", 0, 0, 0, 0.0, 2),
            ("krum", 0, 2, 0, 0.0, 5),
            ("multi_krum", 0, 1, 6, 0.0, 5),
            ("norm_clip", 0, 0, 0, f64::NAN, 5),
            ("mean", 0, 0, 0, 0.0, 5),
        ] {
            let error = Rule::parse(rule, cut, f, k, bound, m).unwrap_err().to_string();
            assert!(error.contains("robust"), "{error}");
        }
        assert!(Rule::parse("krum", 0, 1, 0, 0.0, 5).unwrap().whole_update());
        assert!(!Rule::parse("median", 0, 0, 0, 0.0, 5).unwrap().whole_update());
    }
}
