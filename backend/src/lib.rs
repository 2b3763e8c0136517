//! jet-backend
pub mod tasks;
