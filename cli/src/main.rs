//! `quotalease`: see `quotalease --help`.

use clap::Parser;

fn main() {
    let cli = quotalease_cli::Cli::parse();
    if let Err(e) = quotalease_cli::run(&cli) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
