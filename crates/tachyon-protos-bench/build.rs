//! Generates prost structs for tachyon-protos' `.proto` files (parsed by protox, so no protoc),
//! to compare prost's decoder with the generated ProtoZero views on the same schema.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tachyon-protos/protos");
    let mut files = Vec::new();
    collect(&root, &mut files)?;
    files.sort();
    let fds = protox::compile(&files, [&root])?;
    prost_build::Config::new().compile_fds(fds)?;
    println!("cargo:rerun-if-changed={}", root.display());
    Ok(())
}

fn collect(dir: &std::path::Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}
