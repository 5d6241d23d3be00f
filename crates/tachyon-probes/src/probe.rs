//! The interface between the daemon and its built-in data sources.

use std::time::Duration;

use tachyon::backend::TraceWriter;
use tachyon_protos::DataSourceConfigView;

use crate::perf::Perf;
use crate::process_stats::ProcessStats;
use crate::sys_stats::SysStats;

/// Name of the process and thread naming data source (`ProcessTree` packets).
pub const PROCESS_STATS: &str = "linux.process_stats";
/// Name of the system counters data source (`SysStats` packets).
pub const SYS_STATS: &str = "linux.sys_stats";
/// Name of the CPU sampling data source (`PerfSample` packets with call stacks).
pub const PERF: &str = "linux.perf";

/// A built-in data source instance: the daemon calls it on its own thread, with a trace writer
/// of the instance's target buffer.
///
/// Every method reads `/proc` synchronously and writes whole packets; none of them blocks on
/// anything but the file reads. A probe never panics on what it reads.
pub trait Probe: Send {
    /// Called once when the data source starts.
    fn start(&mut self, w: &mut TraceWriter);
    /// How often [`poll`](Self::poll) should run (None: never).
    fn poll_period(&self) -> Option<Duration>;
    /// Called every [`poll_period`](Self::poll_period).
    fn poll(&mut self, w: &mut TraceWriter);
    /// Called on every flush and before the data source stops; ends by flushing `w`, so what
    /// the probe wrote is committed when it returns.
    fn flush(&mut self, w: &mut TraceWriter);
    /// Called on the session's `clear_period_ms`: a probe that writes only what changed since
    /// it last wrote it forgets that and writes everything again now, so that a ring buffer
    /// that overwrote the first packets still has them. Nothing to do by default.
    fn clear_incremental_state(&mut self, w: &mut TraceWriter) {
        let _ = w;
    }
}

/// The probe for data source `name`, configured by `data_source_config` (an encoded
/// `perfetto.protos.DataSourceConfig`; its `process_stats_config` (103), `sys_stats_config`
/// (104) or `perf_event_config` (111) is read). `None` for a name that is not a built-in data source.
///
/// A config that is not well-formed protobuf counts as empty (every option at its default):
/// the consumer asked for the data source by name, so it gets it.
pub fn create_probe(name: &str, data_source_config: &[u8]) -> Option<Box<dyn Probe>> {
    let cfg = DataSourceConfigView::decode(data_source_config).ok();
    match name {
        PROCESS_STATS => {
            let sub = cfg.and_then(|c| c.process_stats_config().ok());
            Some(Box::new(ProcessStats::new(sub.as_ref())))
        }
        SYS_STATS => {
            let sub = cfg.and_then(|c| c.sys_stats_config().ok());
            Some(Box::new(SysStats::new(sub.as_ref())))
        }
        PERF => {
            let sub = cfg.and_then(|c| c.perf_event_config().ok());
            Some(Box::new(Perf::new(sub.as_ref())))
        }
        _ => None,
    }
}
