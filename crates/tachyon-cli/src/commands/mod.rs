//! One module per subcommand.

pub(crate) mod demo;
pub(crate) mod query;
pub(crate) mod stats;
