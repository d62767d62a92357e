//! The `log` records of liger-burn, CubeCL and Burn on stderr, so that what they report
//! (cuBLASLt missing and the matmul falling back to Burn's, a device feature CubeCL did not
//! find) reaches the user. `-v` adds their informational records, `-vv` their debug
//! records (e.g. CubeCL's device feature detection); the graphics stack (wgpu, naga) is
//! kept to errors, and to warnings with `-v`.

use log::{Level, Log, Metadata, Record};

struct StderrLogger {
    /// Most verbose level of this project's, CubeCL's and Burn's records.
    ours: Level,
    /// Most verbose level of every other crate's records.
    others: Level,
}

/// Whether `target` (a module path) belongs to liger-burn, CubeCL or Burn.
fn is_ours(target: &str) -> bool {
    ["liger", "cubecl", "burn"]
        .iter()
        .any(|prefix| target.starts_with(prefix))
}

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        let most = if is_ours(metadata.target()) {
            self.ours
        } else {
            self.others
        };
        metadata.level() <= most
    }

    fn log(&self, record: &Record) {
        if self.enabled(record.metadata()) {
            let level = match record.level() {
                Level::Error => "error",
                Level::Warn => "warning",
                Level::Info => "info",
                Level::Debug => "debug",
                Level::Trace => "trace",
            };
            eprintln!("{level}: {}: {}", record.target(), record.args());
        }
    }

    fn flush(&self) {}
}

/// Installs the logger for `verbosity` (the count of `-v`).
pub fn install(verbosity: u8) {
    let (ours, others) = match verbosity {
        0 => (Level::Warn, Level::Error),
        1 => (Level::Info, Level::Warn),
        _ => (Level::Debug, Level::Info),
    };
    let logger = Box::leak(Box::new(StderrLogger { ours, others }));
    if log::set_logger(logger).is_ok() {
        log::set_max_level(ours.max(others).to_level_filter());
    }
}
