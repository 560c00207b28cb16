use std::process::ExitCode;

use clap::Parser;
use compaction_proxy::cli::{self, Cli};

fn main() -> anyhow::Result<ExitCode> {
    cli::run(Cli::parse())
}
