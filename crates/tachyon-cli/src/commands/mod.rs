//! One module per subcommand.

pub(crate) mod demo;
pub(crate) mod export;
pub(crate) mod query;
pub(crate) mod record;
pub(crate) mod stats;
pub(crate) mod traced;
