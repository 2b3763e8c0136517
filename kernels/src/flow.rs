//! Precision flows: which arithmetic each GEMM role uses.

use std::fmt;
use std::str::FromStr;

/// The four places a linear layer's GEMM runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmRole {
    /// Y = X W^T while sampling.
    RolloutForward,
    /// Y = X W^T in the trainer (also gives the mismatch metrics).
    TrainForward,
    /// dX = dY W.
    DGrad,
    /// dW = dY^T X (contraction over tokens).
    WGrad,
}

/// The arithmetic of one GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemmPrecision {
    /// f32 operands and output: the exact reference (HF parity, gradient checks).
    F32,
    /// BF16 operands, f32 accumulation, BF16 output.
    Bf16,
    /// E4M3 operands with 1x128 / 128x1 / 128x128 scales, f32 accumulation, BF16 output.
    Fp8,
}

/// A precision flow for a whole run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flow {
    /// Everything in f32: a reference for tests and debugging, not one of the paper's flows.
    F32,
    /// All GEMMs in BF16.
    Bf16,
    /// FP8 rollout, BF16 training: the off-policy baseline.
    Bf16Fp8Rollout,
    /// Jet: one FP8 flow for rollout and training.
    Fp8,
}

impl Flow {
    /// The three flows of the paper's comparison, in the order tables print them.
    pub const PAPER: [Flow; 3] = [Flow::Bf16, Flow::Bf16Fp8Rollout, Flow::Fp8];

    pub fn precision(self, role: GemmRole) -> GemmPrecision {
        use GemmPrecision as P;
        match (self, role) {
            (Flow::F32, _) => P::F32,
            (Flow::Bf16, _) => P::Bf16,
            (Flow::Bf16Fp8Rollout, GemmRole::RolloutForward) => P::Fp8,
            (Flow::Bf16Fp8Rollout, _) => P::Bf16,
            (Flow::Fp8, _) => P::Fp8,
        }
    }

    /// True when the rollout forward is, by construction, the training forward.
    pub fn rollout_is_training_forward(self) -> bool {
        self.precision(GemmRole::RolloutForward) == self.precision(GemmRole::TrainForward)
    }

    /// Whether gradients and activations are rounded to BF16 between ops.
    pub fn low_precision(self) -> bool {
        self != Flow::F32
    }

    pub fn name(self) -> &'static str {
        match self {
            Flow::F32 => "f32",
            Flow::Bf16 => "bf16",
            Flow::Bf16Fp8Rollout => "bf16-fp8rollout",
            Flow::Fp8 => "fp8",
        }
    }
}

impl fmt::Display for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error for an unknown flow name.
#[derive(Debug, thiserror::Error)]
#[error("unknown precision flow '{0}' (expected one of: bf16, bf16-fp8rollout, fp8, f32)")]
pub struct UnknownFlow(pub String);

impl FromStr for Flow {
    type Err = UnknownFlow;
    fn from_str(s: &str) -> Result<Flow, UnknownFlow> {
        match s {
            "f32" => Ok(Flow::F32),
            "bf16" => Ok(Flow::Bf16),
            "bf16-fp8rollout" => Ok(Flow::Bf16Fp8Rollout),
            "fp8" => Ok(Flow::Fp8),
            _ => Err(UnknownFlow(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_of_the_design() {
        use GemmPrecision::*;
        use GemmRole::*;
        let roles = [RolloutForward, TrainForward, DGrad, WGrad];
        let row = |f: Flow| roles.map(|r| f.precision(r));
        assert_eq!(row(Flow::Bf16), [Bf16, Bf16, Bf16, Bf16]);
        assert_eq!(row(Flow::Bf16Fp8Rollout), [Fp8, Bf16, Bf16, Bf16]);
        assert_eq!(row(Flow::Fp8), [Fp8, Fp8, Fp8, Fp8]);
        assert!(Flow::Fp8.rollout_is_training_forward());
        assert!(!Flow::Bf16Fp8Rollout.rollout_is_training_forward());
        for f in [Flow::F32, Flow::Bf16, Flow::Bf16Fp8Rollout, Flow::Fp8] {
            assert_eq!(f.name().parse::<Flow>().unwrap(), f);
        }
        assert!("fp16"
            .parse::<Flow>()
            .unwrap_err()
            .to_string()
            .contains("fp16"));
    }
}
