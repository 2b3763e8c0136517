//! Jet numerics. No I/O.
//!
//! The CPU reference here is the specification of every number Jet computes:
//! f32 accumulation, FP8 E4M3 emulated bit-exactly, BF16 rounding through `half`.
//! Ops are generic over [`Real`] so that every backward can be checked against
//! f64 finite differences with the very code that runs in f32.
//!
//! Layout convention: every tensor is a row-major slice; shapes are given in the
//! comments as `[rows, cols]`.

pub mod bf16;
pub mod cuda;
pub mod flow;
pub mod fp8;
pub mod gemm;
pub mod ops;
pub mod real;

pub use flow::{Flow, GemmPrecision, GemmRole};
pub use real::Real;
