//! jet-backend
pub mod model;
pub mod tasks;
pub mod tokenizer;
