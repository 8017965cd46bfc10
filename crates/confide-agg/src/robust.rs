//! Coordinate-wise robust rules, for the enclave of a `tee_f32_stack` round.
//!
//! In `plain` the aggregator's Python side applies a robust strategy to the stacked updates
//! (`python/confide/aggregator/robust.py`); under `tee` only the enclave may read them, so the
//! rules that look at one coordinate at a time run here, on the opened m × n block of a slice as it
//! completes, and only their n estimates leave the enclave (sealed). Whole-update rules (Krum,
//! norm clipping) would hold every slice of a round in the enclave: not run here.
//!
//! Both rules give what `confide.ml.strategies` gives on the same block: numpy's median (the mean
//! of the two middle values for an even m) and the mean of the middle `m − 2·cut` values, summed
//! in f64 and rounded once to f32.

use crate::error::{invalid, Result};

/// A rule the enclave applies to each coordinate of the participants' updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordinateRule {
    /// The coordinate-wise median.
    Median,
    /// The mean of each coordinate without its `cut` largest and `cut` smallest values.
    TrimmedMean {
        /// Values dropped at each end of a coordinate.
        cut: u32,
    },
}

impl CoordinateRule {
    /// The rule named `rule` (`median`, `trimmed_mean` with `cut` values dropped at each end).
    ///
    /// # Errors
    /// `InvalidParameter` naming the field: an unknown or whole-update rule, a cut that leaves
    /// nothing of `participants` updates, fewer than 3 participants.
    pub fn parse(rule: &str, cut: u32, participants: u32) -> Result<Self> {
        if participants < 3 {
            return Err(invalid("robust", format!("a robust rule needs at least 3 participants, got {participants}")));
        }
        match rule {
            "median" => Ok(CoordinateRule::Median),
            "trimmed_mean" if cut >= 1 && 2 * u64::from(cut) < u64::from(participants) => Ok(CoordinateRule::TrimmedMean { cut }),
            "trimmed_mean" => Err(invalid(
                "robust",
                format!("trimmed_mean must cut at least 1 value at each end and leave one of {participants}, got a cut of {cut}"),
            )),
            "krum" | "multi_krum" | "norm_clip" => Err(invalid(
                "robust",
                format!("{rule} weighs whole updates; the enclave applies coordinate-wise rules only (median, trimmed_mean)"),
            )),
            other => Err(invalid("robust", format!("must be median or trimmed_mean, got {other:?}"))),
        }
    }

    /// The rule's name, as `parse` takes it.
    pub fn name(self) -> &'static str {
        match self {
            CoordinateRule::Median => "median",
            CoordinateRule::TrimmedMean { .. } => "trimmed_mean",
        }
    }

    /// The estimate of each of the `block.len() / participants` coordinates of a row-major
    /// participants × n block of finite values.
    pub fn combine(self, block: &[f32], participants: usize) -> Vec<f32> {
        let n = block.len() / participants;
        let mut column = vec![0f32; participants];
        let mut out = Vec::with_capacity(n);
        for j in 0..n {
            for (p, value) in column.iter_mut().enumerate() {
                *value = block[p * n + j];
            }
            column.sort_unstable_by(f32::total_cmp);
            out.push(match self {
                CoordinateRule::Median if participants % 2 == 1 => column[participants / 2],
                CoordinateRule::Median => ((f64::from(column[participants / 2 - 1]) + f64::from(column[participants / 2])) / 2.0) as f32,
                CoordinateRule::TrimmedMean { cut } => {
                    let kept = &column[cut as usize..participants - cut as usize];
                    (kept.iter().map(|&v| f64::from(v)).sum::<f64>() / kept.len() as f64) as f32
                }
            });
        }
        column.iter_mut().for_each(|v| *v = 0.0); // an update's values do not outlive the call
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts_and_trimmed_mean_drop_the_extremes() {
        // 3 participants x 2 coordinates, row-major: one outlier per column
        let block = [1.0, -5.0, 100.0, 2.0, 3.0, 4.0];
        assert_eq!(CoordinateRule::Median.combine(&block, 3), vec![3.0, 2.0]);
        let four = [1.0, 2.0, 10.0, 4.0];
        assert_eq!(CoordinateRule::Median.combine(&four, 4), vec![3.0]);
        let five = [1.0, 2.0, 3.0, 1000.0, -1000.0];
        assert_eq!(CoordinateRule::TrimmedMean { cut: 1 }.combine(&five, 5), vec![2.0]);
    }

    #[test]
    fn parse_refuses_whole_update_rules_and_cuts_that_leave_nothing() {
        assert_eq!(CoordinateRule::parse("trimmed_mean", 1, 5).unwrap(), CoordinateRule::TrimmedMean { cut: 1 });
        for (rule, cut, m) in [("krum", 0, 5), ("trimmed_mean", 2, 4), ("trimmed_mean", 0, 5), ("median", 0, 2), ("mean", 0, 5)] {
            let error = CoordinateRule::parse(rule, cut, m).unwrap_err().to_string();
            assert!(error.contains("robust"), "{error}");
        }
    }
}
