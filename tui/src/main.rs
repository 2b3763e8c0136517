//! jetctl: the Jet operator console. `jetctl` opens the console; `jetctl SUBCOMMAND`
//! scripts jetd (see `jetctl --help`).

use clap::Parser;
use jet_tui::cli::{self, Cli};

fn main() {
    let cli = Cli::parse();
    let code = match &cli.cmd {
        Some(cmd) => match cli::run(&cli, cmd, &mut std::io::stdout().lock()) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("jetctl: {e}");
                e.exit_code()
            }
        },
        None => match jet_tui::console::run(cli.socket_path(), cli.readonly, cli.timeout()) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("jetctl: {e:#}");
                1
            }
        },
    };
    std::process::exit(code);
}
