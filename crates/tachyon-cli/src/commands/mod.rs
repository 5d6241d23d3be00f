//! One module per subcommand.

pub(crate) mod capture;
pub(crate) mod demo;
pub(crate) mod export;
pub(crate) mod memory_stats;
pub(crate) mod profile;
pub(crate) mod query;
pub(crate) mod record;
pub(crate) mod stats;
pub(crate) mod symbolize;
pub(crate) mod traced;
