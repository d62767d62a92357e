//! Benchmark CSV rows, Liger-Kernel's layout:
//! `kernel,provider,mode,metric,x,p50,p20,p80,config,gpu,commit,date`.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::Path;

/// The header line, exactly.
pub const HEADER: &str = "kernel,provider,mode,metric,x,p50,p20,p80,config,gpu,commit,date";

/// One measurement.
#[derive(Clone, Debug)]
pub struct Row {
    /// Op (`rms_norm`, ..., `copy`).
    pub kernel: String,
    /// `liger` or `burn`.
    pub provider: String,
    /// `forward`, `backward` or `full`.
    pub mode: String,
    /// `ms`, `MB` or `GB/s`.
    pub metric: String,
    /// The shape, e.g. `8192x4096`.
    pub x: String,
    /// Median.
    pub p50: f64,
    /// 20th percentile.
    pub p20: f64,
    /// 80th percentile.
    pub p80: f64,
    /// dtype, iteration counts and notes.
    pub config: String,
}

/// Columns shared by every row of a run.
#[derive(Clone, Debug)]
pub struct RunInfo {
    /// `gpu` column.
    pub gpu: String,
    /// `commit` column.
    pub commit: String,
    /// `date` column (UTC, YYYY-MM-DD).
    pub date: String,
}

/// Quotes a field when it holds a comma, a quote or a line break (RFC 4180).
pub fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// A number field: up to 6 decimals, trailing zeros trimmed; empty when not finite.
pub fn number(x: f64) -> String {
    if x.is_finite() {
        // Enough digits for sub-microsecond times in ms and for GB/s.
        let s = format!("{x:.6}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        if s.is_empty() || s == "-" {
            "0".into()
        } else {
            s.to_string()
        }
    } else {
        String::new()
    }
}

impl Row {
    /// The CSV line (no line break).
    pub fn line(&self, run: &RunInfo) -> String {
        [
            field(&self.kernel),
            field(&self.provider),
            field(&self.mode),
            field(&self.metric),
            field(&self.x),
            number(self.p50),
            number(self.p20),
            number(self.p80),
            field(&self.config),
            field(&run.gpu),
            field(&run.commit),
            field(&run.date),
        ]
        .join(",")
    }
}

/// Appends `rows` to `path`, writing the header first when the file is new or empty.
pub fn append(path: &Path, rows: &[Row], run: &RunInfo) -> Result<()> {
    let lines: Vec<String> = rows.iter().map(|row| row.line(run)).collect();
    append_lines(path, HEADER, &lines)
}

/// Appends CSV `lines` to `path`, writing `header` first when the file is new or empty;
/// refuses a file that starts with another header (rows of another layout).
pub fn append_lines(path: &Path, header: &str, lines: &[String]) -> Result<()> {
    let existing = std::fs::read_to_string(path).unwrap_or_default();
    if let Some(first) = existing.lines().next()
        && first != header
    {
        anyhow::bail!(
            "{} holds CSV rows of another layout (header `{first}`, expected `{header}`); \
             write to another file",
            path.display()
        );
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let mut out = String::new();
    if existing.is_empty() {
        out.push_str(header);
        out.push('\n');
    }
    for line in lines {
        out.push_str(line);
        out.push('\n');
    }
    file.write_all(out.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Today's UTC date, YYYY-MM-DD, from the system clock.
pub fn utc_date() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    format!("{y:04}-{m:02}-{d:02}")
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
        assert_eq!(civil_from_days(20_414), (2025, 11, 22));
    }

    #[test]
    fn quoting() {
        assert_eq!(field("a b"), "a b");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(number(1.5), "1.5");
        assert_eq!(number(2.0), "2");
        assert_eq!(number(0.0), "0");
    }
}
