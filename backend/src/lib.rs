//! jet-backend: models and HF I/O, the rollout engine, the trainer, the RL
//! algorithm, tasks and rewards, the run store and the daemon (binary `jetd`).

pub mod bench;
pub mod chat;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod gpu;
pub mod health;
pub mod model;
pub mod rl;
pub mod rollout;
pub mod store;
pub mod tasks;
pub mod tokenizer;
pub mod trainer;
pub mod transformer;
