//! jetd: the Jet daemon and its foreground commands.

use std::process::ExitCode;

use clap::Parser;
use jet_backend::cli::{self, Cli};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli::dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("jetd: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
