//! Which `.proto` files tachyon-protos is generated from. Not part of the library: included with
//! `#[path]` by `cargo xtask gen-protos`, by the bootstrap test, by tachyon-protos-bench's build
//! script and by tachyon-cli's (the text-format config parser's schema), so that all agree on
//! the list.

use std::path::{Path, PathBuf};

/// Every `.proto` under `dir`, relative to it, sorted (the generator's output does not depend
/// on the order, but a stable list keeps diagnostics stable).
pub(crate) fn proto_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(base, &path, out)?;
            } else if path.extension().is_some_and(|e| e == "proto") {
                out.push(path.strip_prefix(base).expect("under base").to_path_buf());
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.sort();
    Ok(out)
}
