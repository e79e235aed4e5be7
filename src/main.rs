//! The `adf` binary: parse the command line, run it, and turn any error into
//! one line on stderr and a non-zero exit status. A panic hook makes sure a
//! panic (a bug) still ends with a readable message.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // A sandbox worker the runtime started (never a command people type).
    if std::env::args_os().nth(1).is_some_and(|a| a == "__sandbox") {
        adf::sandbox::worker::main();
    }
    std::panic::set_hook(Box::new(|info| {
        // A document parser failing on a bad file: reported as an error.
        if adf::docs::panic_is_contained() {
            return;
        }
        // The terminal app may have the terminal in raw mode.
        adf::tui::restore_terminal();
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        eprintln!("adf: internal error{at}: {msg}. This is a bug; please report it.");
    }));
    let cli = match adf::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    // Every model call is recorded in the app-wide usage ledger (benchmarks
    // would only fill it with their own scripted calls).
    if !matches!(cli.command, Some(adf::cli::Command::Bench { .. })) {
        adf::ledger::enable();
    }
    let result = adf::cli::run(cli);
    adf::ledger::flush();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            if is_broken_pipe(&e) {
                return ExitCode::SUCCESS;
            }
            eprintln!("adf: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().filter_map(|c| c.downcast_ref::<std::io::Error>()).any(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
}

/// Help and version print as clap writes them; a usage error is at most two
/// lines: what is wrong, and the usage of the command it concerns.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return ExitCode::from(if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand { 2 } else { 0 });
    }
    let text = e.render().to_string();
    let mut lines = text.lines().map(str::trim_end).filter(|l| !l.is_empty());
    let what = lines.next().unwrap_or("error: invalid arguments").trim_start_matches("error: ");
    let usage = lines.find(|l| l.starts_with("Usage:")).map(|u| u.trim_start_matches("Usage: ").to_string());
    eprintln!("adf: {what}");
    if let Some(u) = usage {
        eprintln!("usage: {u} (see --help)");
    }
    ExitCode::from(2)
}
