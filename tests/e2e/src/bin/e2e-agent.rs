//! `e2e-agent`: the test-only helper inside the node VM (never part of a product image).
//!
//! * `--csi-port P --socket PATH`: every TCP connection on `0.0.0.0:P` is spliced to the unix
//!   socket PATH (edgevol-node's CSI endpoint), byte for byte, so the host's gRPC client talks to
//!   the real plugin through QEMU's slirp `hostfwd`.
//! * `--exec-port P`: a connection sends `<budget-secs>\n<shell command>` and half-closes; the
//!   agent runs `sh -c` with stdout and stderr merged, kills it when the budget is spent (exit
//!   code 124, as timeout(1)), and answers `<exit code>\n<output>`.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::process::{Command, ExitCode, Stdio};
use std::thread;
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let (Some(csi_port), Some(socket), Some(exec_port)) =
        (flag("--csi-port"), flag("--socket"), flag("--exec-port"))
    else {
        eprintln!("usage: e2e-agent --csi-port P --socket PATH --exec-port P");
        return ExitCode::from(2);
    };
    let csi = match TcpListener::bind(format!("0.0.0.0:{csi_port}")) {
        Ok(l) => l,
        Err(e) => return fail(&format!("bind {csi_port}: {e}")),
    };
    let exec = match TcpListener::bind(format!("0.0.0.0:{exec_port}")) {
        Ok(l) => l,
        Err(e) => return fail(&format!("bind {exec_port}: {e}")),
    };
    thread::spawn(move || {
        for conn in exec.incoming().flatten() {
            thread::spawn(move || {
                if let Err(e) = serve_exec(conn) {
                    eprintln!("e2e-agent: exec: {e}");
                }
            });
        }
    });
    eprintln!("e2e-agent: csi :{csi_port} -> {socket}, exec :{exec_port}");
    for conn in csi.incoming().flatten() {
        let socket = socket.clone();
        thread::spawn(move || {
            if let Err(e) = splice(conn, &socket) {
                eprintln!("e2e-agent: csi: {e}");
            }
        });
    }
    ExitCode::SUCCESS
}

fn fail(e: &str) -> ExitCode {
    eprintln!("e2e-agent: error: {e}");
    ExitCode::FAILURE
}

fn splice(tcp: TcpStream, socket: &str) -> io::Result<()> {
    tcp.set_nodelay(true)?;
    let unix = UnixStream::connect(socket)?;
    let (mut tcp_r, mut unix_w) = (tcp.try_clone()?, unix.try_clone()?);
    let up = thread::spawn(move || {
        let _ = io::copy(&mut tcp_r, &mut unix_w);
        let _ = unix_w.shutdown(Shutdown::Write);
    });
    let (mut unix_r, mut tcp_w) = (unix, tcp);
    let _ = io::copy(&mut unix_r, &mut tcp_w);
    let _ = tcp_w.shutdown(Shutdown::Write);
    let _ = up.join();
    Ok(())
}

fn serve_exec(mut conn: TcpStream) -> io::Result<()> {
    let mut request = String::new();
    conn.read_to_string(&mut request)?;
    let (budget, command) = request
        .split_once('\n')
        .ok_or_else(|| io::Error::other("want '<secs>\\n<command>'"))?;
    let budget: u64 = budget
        .trim()
        .parse()
        .map_err(|_| io::Error::other("bad budget"))?;
    let (code, output) = run(command, Duration::from_secs(budget))?;
    conn.write_all(format!("{code}\n").as_bytes())?;
    conn.write_all(&output)?;
    conn.shutdown(Shutdown::Write)
}

fn run(command: &str, budget: Duration) -> io::Result<(i32, Vec<u8>)> {
    let (reader, writer) = io::pipe()?;
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(command)
        .stdin(Stdio::null())
        .stdout(writer.try_clone()?)
        .stderr(writer)
        .spawn()?;
    let collect = thread::spawn(move || {
        let mut out = Vec::new();
        let mut reader = reader;
        let _ = reader.read_to_end(&mut out);
        out
    });
    let deadline = Instant::now() + budget;
    let code = loop {
        if let Some(status) = child.try_wait()? {
            break status.code().unwrap_or(128);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break 124;
        }
        thread::sleep(Duration::from_millis(20));
    };
    // A background process that keeps the pipe open must not hang the answer.
    let output = wait_joined(collect, Duration::from_secs(2));
    Ok((code, output))
}

fn wait_joined(handle: thread::JoinHandle<Vec<u8>>, grace: Duration) -> Vec<u8> {
    let until = Instant::now() + grace;
    while !handle.is_finished() && Instant::now() < until {
        thread::sleep(Duration::from_millis(10));
    }
    if handle.is_finished() {
        handle.join().unwrap_or_default()
    } else {
        b"(output still open by a background process)\n".to_vec()
    }
}
