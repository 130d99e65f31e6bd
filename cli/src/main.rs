//! `quotalease`: see `quotalease --help`.

use clap::{CommandFactory, Parser};

fn main() {
    let cli = quotalease_cli::Cli::parse();
    // A Redis subcommand with neither --redis nor QUOTALEASE_REDIS_URL: a
    // usage error (exit 2, as clap's own), naming both.
    if let Some(message) = cli.missing_redis() {
        quotalease_cli::Cli::command()
            .error(clap::error::ErrorKind::MissingRequiredArgument, message)
            .exit();
    }
    if let Err(e) = quotalease_cli::run(&cli) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
