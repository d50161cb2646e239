//! `edgevol-node`: parses flags, serves CSI Identity + Node until SIGINT/SIGTERM.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use edgevol_node::{build_linux, serve, Args};

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: kubectl logs and journald get plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let plugin = match build_linux(&args) {
        Ok(p) => p,
        Err(e) => return fail(&e),
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("tokio runtime: {e}")),
    };
    match runtime.block_on(serve(plugin, shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(e: &str) -> ExitCode {
    eprintln!("edgevol-node: error: {e}");
    ExitCode::FAILURE
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("signal received: stopping");
}
