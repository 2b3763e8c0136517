//! jetctl, the Jet operator console: a client of jetd's wire protocol, scriptable
//! subcommands, and a ratatui console whose state ([`app::App`]) is kept apart from
//! its drawing ([`ui::draw`]) so that views can be tested on a `TestBackend`.

pub mod app;
pub mod cli;
pub mod client;
pub mod compare;
pub mod console;
pub mod fmt;
pub mod keys;
pub mod output;
pub mod plot;
pub mod replay;
pub mod series;
pub mod ui;
