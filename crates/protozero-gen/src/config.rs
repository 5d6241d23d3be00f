//! [`Config`]: the library front end for `build.rs` and xtask, parsing with protox.

use std::path::{Path, PathBuf};

use crate::{generate, Error, GeneratedFile, Layout, Options};

/// Compiles `.proto` files to ProtoZero writers and views, prost-build style.
///
/// Parsing is done by [protox](https://docs.rs/protox) in Rust: no `protoc` is needed.
///
/// ```no_run
/// // build.rs
/// fn main() -> Result<(), Box<dyn std::error::Error>> {
///     protozero_gen::Config::new()
///         .compile_protos(&["protos/perfetto/trace/trace.proto"], &["protos"])?;
///     println!("cargo:rerun-if-changed=protos");
///     Ok(())
/// }
/// ```
///
/// and in the crate, with the default [`Layout::PerPackage`]:
///
/// ```text
/// pub mod perfetto {
///     pub mod protos {
///         include!(concat!(env!("OUT_DIR"), "/perfetto.protos.rs"));
///     }
/// }
/// ```
#[derive(Clone, Debug, Default)]
pub struct Config {
    options: Options,
    out_dir: Option<PathBuf>,
}

impl Config {
    /// A configuration with the default [`Options`], writing to `$OUT_DIR`.
    pub fn new() -> Self {
        Config::default()
    }

    /// Sets how the output is split into files (default [`Layout::PerPackage`]).
    pub fn layout(&mut self, layout: Layout) -> &mut Self {
        self.options.layout = layout;
        self
    }

    /// Sets all options at once.
    pub fn options(&mut self, options: Options) -> &mut Self {
        self.options = options;
        self
    }

    /// Sets the directory [`compile_protos`](Self::compile_protos) writes to (default: the
    /// `OUT_DIR` environment variable Cargo sets for build scripts).
    pub fn out_dir(&mut self, dir: impl Into<PathBuf>) -> &mut Self {
        self.out_dir = Some(dir.into());
        self
    }

    /// Parses `protos` (paths, or names relative to an include directory) and everything they
    /// import from `includes`, generates code for `protos`, and writes it to the output
    /// directory. A file whose content is unchanged is not rewritten, so Cargo does not rebuild
    /// for nothing.
    ///
    /// # Errors
    ///
    /// Parse errors, generator errors (see [`generate`](crate::generate)) and I/O errors; no
    /// output directory if neither [`out_dir`](Self::out_dir) nor `OUT_DIR` is set.
    pub fn compile_protos(
        &self,
        protos: &[impl AsRef<Path>],
        includes: &[impl AsRef<Path>],
    ) -> Result<Vec<PathBuf>, Error> {
        let out_dir = match &self.out_dir {
            Some(dir) => dir.clone(),
            None => std::env::var_os("OUT_DIR")
                .map(PathBuf::from)
                .ok_or_else(|| {
                    Error::InvalidOption(
                        "no output directory: call `out_dir` or set OUT_DIR".into(),
                    )
                })?,
        };
        let files = self.generate_to_strings(protos, includes)?;
        let mut written = Vec::with_capacity(files.len());
        for file in files {
            let path = out_dir.join(&file.name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|source| Error::Io {
                    path: parent.to_owned(),
                    source,
                })?;
            }
            let unchanged = std::fs::read(&path).is_ok_and(|old| old == file.content.as_bytes());
            if !unchanged {
                std::fs::write(&path, &file.content).map_err(|source| Error::Io {
                    path: path.clone(),
                    source,
                })?;
            }
            written.push(path);
        }
        Ok(written)
    }

    /// Like [`compile_protos`](Self::compile_protos), but returns the files instead of writing
    /// them (for bootstrap tests that compare checked-in code with a fresh generation).
    ///
    /// # Errors
    ///
    /// Parse and generator errors.
    pub fn generate_to_strings(
        &self,
        protos: &[impl AsRef<Path>],
        includes: &[impl AsRef<Path>],
    ) -> Result<Vec<GeneratedFile>, Error> {
        let mut compiler = protox::Compiler::new(includes)?;
        compiler
            .include_imports(true)
            .include_source_info(true)
            .open_files(protos)?;
        let to_generate: Vec<String> = compiler
            .files()
            .filter(|f| !f.is_import())
            .map(|f| f.name().to_owned())
            .collect();
        generate(&compiler.file_descriptor_set(), &to_generate, &self.options)
    }
}
