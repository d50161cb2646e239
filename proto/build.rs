//! Compiles `csi.proto`, `volumegroup.proto` and `edgevol.proto` with protox (pure Rust, no
//! `protoc` binary) and generates prost messages plus tonic clients and
//! servers. The encoded `FileDescriptorSet` (with custom options intact) is
//! written to `OUT_DIR/edgevol_descriptor_set.bin` for reflection and tests.

use std::{env, fs, path::PathBuf};

const PROTOS: [&str; 3] = ["csi.proto", "volumegroup.proto", "edgevol.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);

    for proto in PROTOS {
        println!(
            "cargo:rerun-if-changed={}",
            manifest_dir.join(proto).display()
        );
    }
    println!("cargo:rerun-if-changed=build.rs");

    let mut compiler = protox::Compiler::new([&manifest_dir])?;
    compiler.include_imports(true).include_source_info(true);
    compiler.open_files(PROTOS)?;

    // Source info keeps the proto comments as rustdoc on generated items.
    let fds = compiler.file_descriptor_set();

    // The exported set drops source info (size) but keeps imports, so a
    // reflection service can resolve google/protobuf types. Unlike
    // `prost_types` encoding, this path keeps extension options such as
    // `csi_secret` (1059) and the alpha markers (1060).
    compiler.include_source_info(false);
    fs::write(
        out_dir.join("edgevol_descriptor_set.bin"),
        compiler.encode_file_descriptor_set(),
    )?;

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .emit_rerun_if_changed(false)
        .compile_fds(fds)?;

    Ok(())
}
