//! The `tachyon traced` daemon's built-in data sources, which read Linux's `/proc` and write
//! Perfetto packets, so a system trace names every process and thread and carries the
//! machine's CPU and memory counters:
//!
//! - [`PROCESS_STATS`] (`linux.process_stats`): `ProcessTree` packets with every process's pid,
//!   parent pid, uid and command line and every thread's tid, process and name, at start and
//!   then whatever is new or renamed at every poll and flush.
//! - [`SYS_STATS`] (`linux.sys_stats`): `SysStats` packets with `/proc/meminfo`,
//!   `/proc/vmstat` and `/proc/stat` figures (per-CPU times, forks, interrupts) at the periods
//!   of the `SysStatsConfig`.
//! - [`PERF`] (`linux.perf`): `PerfSample` packets with interned call stacks, from
//!   `perf_event_open` CPU sampling of the processes the `PerfEventConfig` names.
//!
//! The daemon creates a [`Probe`] with [`create_probe`] from the data source's name and its
//! `DataSourceConfig`, calls [`Probe::start`], then [`Probe::poll`] every
//! [`Probe::poll_period`] and [`Probe::flush`] on every flush and before stopping, each time
//! with the instance's [`tachyon::backend::TraceWriter`]. Timestamps are `CLOCK_BOOTTIME` nanoseconds,
//! Perfetto's default trace clock, so the packets carry no clock id.
//!
//! ```
//! use tachyon_protos::DataSourceConfig;
//!
//! let mut buf = protozero::HeapBuffered::new();
//! {
//!     let mut config: DataSourceConfig<'_> = buf.root();
//!     config.set_name(tachyon_probes::SYS_STATS);
//!     config.set_sys_stats_config().set_meminfo_period_ms(250);
//! }
//! let config = buf.serialize()?;
//! let probe = tachyon_probes::create_probe(tachyon_probes::SYS_STATS, &config).unwrap();
//! assert_eq!(probe.poll_period(), Some(std::time::Duration::from_millis(250)));
//! assert!(tachyon_probes::create_probe("no.such.source", &config).is_none());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! On systems without `/proc` the probes find nothing and write nothing.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod counters;
mod perf;
mod probe;
mod process_stats;
mod procfs;
mod sys_stats;

pub use probe::{create_probe, Probe, PERF, PROCESS_STATS, SYS_STATS};
