//! [`Options`] and [`Layout`]: what the generator produces, shared by both front ends.

use crate::Error;

/// How generated code is split into files.
///
/// Generated code names every type of another module by a relative `super::` path computed
/// from the module tree `package a.b;` → `a::b`, so code generated with either layout links up
/// as long as each package's code sits at its package's place in that tree.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum Layout {
    /// One file per proto package, named after the package (`perfetto.protos.rs`; `_.rs` for
    /// files without a package), holding the package's items without the package modules
    /// around them, as prost does. Mount each where its package belongs:
    ///
    /// ```text
    /// pub mod perfetto {
    ///     pub mod protos {
    ///         include!(concat!(env!("OUT_DIR"), "/perfetto.protos.rs"));
    ///     }
    /// }
    /// ```
    #[default]
    PerPackage,
    /// One file with the given name holding every package as nested `pub mod`s
    /// (`pub mod perfetto { pub mod protos { ... } }`); `include!` it where the root of the
    /// package tree should be.
    SingleFile(String),
}

/// Generator options.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Options {
    /// How the output is split into files.
    pub layout: Layout,
}

impl Options {
    /// The default options: [`Layout::PerPackage`].
    pub fn new() -> Self {
        Options::default()
    }

    /// Sets the layout.
    pub fn layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// Parses the options of a protoc plugin parameter (`--protozero_opt=...` or the part of
    /// `--protozero_out=PARAM:DIR` before the colon): comma-separated `key=value` pairs.
    ///
    /// | parameter | meaning |
    /// |---|---|
    /// | `layout=package` | [`Layout::PerPackage`] (the default) |
    /// | `layout=single:NAME` | [`Layout::SingleFile`] named `NAME` |
    ///
    /// ```
    /// use protozero_gen::{Layout, Options};
    ///
    /// let opts = Options::from_parameter("layout=single:trace.rs")?;
    /// assert_eq!(opts.layout, Layout::SingleFile("trace.rs".into()));
    /// assert!(Options::from_parameter("colour=blue").is_err());
    /// # Ok::<(), protozero_gen::Error>(())
    /// ```
    pub fn from_parameter(parameter: &str) -> Result<Options, Error> {
        let mut opts = Options::default();
        for item in parameter
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            let (key, value) = item.split_once('=').unwrap_or((item, ""));
            match (key.trim(), value.trim()) {
                ("layout", "package") => opts.layout = Layout::PerPackage,
                ("layout", v) if v.starts_with("single:") => {
                    let name = &v["single:".len()..];
                    if name.is_empty() || name.ends_with('/') {
                        return Err(Error::InvalidOption(format!(
                            "`layout=single:NAME` needs a file name, got `{item}`"
                        )));
                    }
                    opts.layout = Layout::SingleFile(name.to_owned());
                }
                _ => {
                    return Err(Error::InvalidOption(format!(
                        "unknown parameter `{item}` (expected `layout=package` or \
                         `layout=single:NAME`)"
                    )))
                }
            }
        }
        Ok(opts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters() {
        assert_eq!(Options::from_parameter("").unwrap(), Options::default());
        assert_eq!(
            Options::from_parameter("layout=package").unwrap().layout,
            Layout::PerPackage
        );
        assert_eq!(
            Options::from_parameter(" layout = single:a/b.rs ")
                .unwrap()
                .layout,
            Layout::SingleFile("a/b.rs".into())
        );
        assert!(Options::from_parameter("layout=single:").is_err());
        assert!(Options::from_parameter("layout=single").is_err());
        assert!(Options::from_parameter("layout").is_err());
        assert!(Options::from_parameter("x=y").is_err());
    }
}
