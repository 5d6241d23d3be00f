//! [`Error`]: everything that can stop code generation.

use std::fmt;
use std::path::PathBuf;

/// Why code could not be generated.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The schema uses a feature the generator does not support (groups, editions, field
    /// numbers above protozero's limit). `element` is the full proto name of the offending
    /// field or file.
    Unsupported {
        /// The proto element, e.g. `pkg.Message.field` or a file name.
        element: String,
        /// What is not supported.
        reason: String,
    },
    /// The descriptors are inconsistent: a file to generate or a referenced type is missing, a
    /// field has no type, ...
    InvalidDescriptor(String),
    /// An option (or a protoc plugin parameter) is not understood.
    InvalidOption(String),
    /// protox could not parse or resolve the `.proto` files.
    Parse(Box<protox::Error>),
    /// Reading or writing a file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Unsupported { element, reason } => write!(f, "{element}: {reason}"),
            Error::InvalidDescriptor(msg) => write!(f, "invalid descriptor: {msg}"),
            Error::InvalidOption(msg) => write!(f, "invalid option: {msg}"),
            Error::Parse(e) => write!(f, "{e}"),
            Error::Io { path, source } => write!(f, "{}: {source}", path.display()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Parse(e) => Some(&**e),
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<protox::Error> for Error {
    fn from(e: protox::Error) -> Self {
        Error::Parse(Box::new(e))
    }
}
