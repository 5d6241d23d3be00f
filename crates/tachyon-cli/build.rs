//! Compiles Perfetto's TraceConfig schema (`schema/protos/`, a copy of Perfetto's config protos;
//! see `schema/README.md`) with protox, so no protoc, into an encoded `FileDescriptorSet` that
//! `trace_config_text` embeds: every field of Perfetto's TraceConfig parses in `.pbtxt` configs.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("schema");
    // A directory: Cargo rescans it, so added, removed and edited files all count.
    println!("cargo:rerun-if-changed={}", root.display());
    let fds = protox::compile(["protos/perfetto/config/trace_config.proto"], [&root])?;
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    std::fs::write(
        out.join("perfetto_descriptor_set.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    Ok(())
}
