//! jetctl: the Jet operator console. The console itself lands with its own issue;
//! for now it reports its version and usage.

use clap::Parser;

/// The Jet operator console (attaches to a running jetd).
#[derive(Parser)]
#[command(name = "jetctl", version, about)]
struct Cli {}

fn main() {
    let _ = Cli::parse();
    println!(
        "jetctl {}: the console is not built yet; see `jetctl --help`",
        env!("CARGO_PKG_VERSION")
    );
}
