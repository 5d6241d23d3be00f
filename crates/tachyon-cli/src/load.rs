//! Loading a trace, with a progress bar on stderr when stderr is a terminal.

use std::io::IsTerminal;
use std::path::Path;

use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressStyle};
use tachyon_processor::{Options, SortMode, TraceProcessor};

/// `--sort`: how events are ordered before parsing.
#[derive(Clone, Copy, Debug, Default, ValueEnum)]
pub(crate) enum Sort {
    /// Sort everything once the whole file is read (never drops events).
    #[default]
    Full,
    /// Perfetto's windowed extraction for streamed (write_into_file) traces.
    Windowed,
}

pub(crate) fn load(path: &Path, sort: Sort) -> Result<TraceProcessor, Box<dyn std::error::Error>> {
    let options = Options::with_sort(match sort {
        Sort::Full => SortMode::Full,
        Sort::Windowed => SortMode::Windowed,
    });
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        bar.set_message("loading");
        bar
    });
    let result = TraceProcessor::open_with_progress(path, &options, &mut |p| {
        if let Some(bar) = &bar {
            bar.set_length(p.total);
            bar.set_position(p.done);
            if p.done == p.total {
                bar.set_message("building tables");
            }
        }
    });
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    result.map_err(|e| format!("{}: {e}", path.display()).into())
}
