//! Compiles tachyon-protos' `.proto` files (with protox, so no protoc) into an encoded
//! `FileDescriptorSet` that `trace_config_text` embeds: the text-format TraceConfig parser reads
//! its schema from the same files the generated views come from, so a field added there is
//! accepted in `.pbtxt` configs without touching the CLI.

use std::path::PathBuf;

#[path = "../tachyon-protos/proto_files.rs"]
mod proto_files;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tachyon-protos/protos");
    // A directory: Cargo rescans it, so added, removed and edited files all count.
    println!("cargo:rerun-if-changed={}", root.display());
    let files = proto_files::proto_files(&root)?;
    let fds = protox::compile(&files, [&root])?;
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?);
    std::fs::write(
        out.join("perfetto_descriptor_set.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    Ok(())
}
