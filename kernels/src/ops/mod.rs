//! The reference ops, forward and backward side by side, one op a module.

#[cfg(test)]
pub mod gradcheck;
pub mod linear;
