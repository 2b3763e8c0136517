//! The reference ops, forward and backward side by side, one op a module.

pub mod attention;
pub mod embedding;
#[cfg(test)]
pub mod gradcheck;
pub mod linear;
pub mod logsoftmax;
pub mod rmsnorm;
pub mod rope;
pub mod swiglu;
