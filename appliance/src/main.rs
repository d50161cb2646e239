//! `edgevold`: parses flags, starts the daemon, runs until SIGINT/SIGTERM; or runs an operator
//! command (`edgevold format`).

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use edgevol_appliance::format::{self, FormatArgs};
use edgevol_appliance::naming::uuid_string;
use edgevol_appliance::progress::human_bytes;
use edgevol_appliance::{start, Args, Command, Config, DaemonError};

fn main() -> ExitCode {
    let mut args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: a log file or journald gets plain text.
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    if let Some(Command::Format(f)) = args.command.take() {
        return format_device(&f);
    }
    let config = match Config::from_args(args) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("tokio runtime: {e}")),
    };
    runtime.block_on(async move {
        let mut running = match start(config.clone()).await {
            Ok(r) => r,
            Err(e) => return exit(Err(e)),
        };
        print_banner(&config, &running);
        tokio::select! {
            result = running.wait() => return exit(result),
            () = shutdown_signal() => tracing::info!("signal received: stopping"),
        }
        exit(running.stop().await)
    })
}

fn format_device(args: &FormatArgs) -> ExitCode {
    match format::run(args) {
        Ok(done) => {
            println!(
                "formatted {}: edgevol pool {}, {} of data clusters",
                args.device.display(),
                uuid_string(done.uuid),
                human_bytes(done.capacity)
            );
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

/// How the daemon ended: 0 when stopped, 70 (EX_SOFTWARE) after a panic, 78 (EX_CONFIG) for a
/// pool this firmware cannot read, 79 for a host-key store or firmware state record newer
/// firmware wrote, 1 for other errors ([`DaemonError::exit_code`]).
fn exit(ended: Result<(), DaemonError>) -> ExitCode {
    match ended {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("edgevold: error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn fail(e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("edgevold: error: {e}");
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
}

/// What a first-time user needs: where things are and how to connect.
fn print_banner(config: &Config, running: &edgevol_appliance::Running) {
    let addr = running.local_addr;
    println!(
        "edgevold {} appliance {:?} serving CSI over mTLS on {addr}",
        env!("CARGO_PKG_VERSION"),
        running.state.appliance_id
    );
    for device in &config.devices {
        println!("  pool device: {}", device.display());
    }
    println!("  CA:          {}", config.tls.ca.display());
    let auth = if config.host_auth.allow_unauthenticated_hosts {
        "hosts without DH-HMAC-CHAP keys allowed"
    } else {
        "DH-HMAC-CHAP required: nodes enrol with a node certificate"
    };
    println!("  NVMe/TCP:    {} ({auth})", running.target.endpoint);
    if config.dev {
        let pki = config.data_dir.join("pki");
        println!(
            "  clients:     {}/{{admin,controller,observer,node}}.{{pem,key}}",
            pki.display()
        );
        println!("  connect a CO through the proxy:");
        println!(
            "    edgevol proxy --listen unix:///tmp/edgevol-csi.sock --appliance {addr} \\\n      --ca {} --cert {p}/controller.pem --key {p}/controller.key",
            config.tls.ca.display(),
            p = pki.display()
        );
        println!("  a node plugin enrols for its data-path keys with:");
        println!(
            "    edgevol-node ... --appliance {addr} --appliance-ca {} \\\n      --node-cert {p}/node.pem --node-key {p}/node.key",
            config.tls.ca.display(),
            p = pki.display()
        );
    }
}
