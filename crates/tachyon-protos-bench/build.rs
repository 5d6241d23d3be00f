//! Generates prost structs for tachyon-protos' `.proto` files (parsed by protox, so no protoc),
//! to compare prost's decoder with the generated ProtoZero views on the same schema.

use std::path::PathBuf;

#[path = "../tachyon-protos/proto_files.rs"]
mod proto_files;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tachyon-protos/protos");
    let files = proto_files::proto_files(&root)?;
    let fds = protox::compile(&files, [&root])?;
    prost_build::Config::new().compile_fds(fds)?;
    println!("cargo:rerun-if-changed={}", root.display());
    Ok(())
}
