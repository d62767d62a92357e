//! Plain-text tables for the terminal.

/// How a column is aligned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// A table built row by row and printed with columns padded to their widest cell.
#[derive(Clone, Debug)]
pub struct Table {
    headers: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Row>,
}

#[derive(Clone, Debug)]
enum Row {
    Cells(Vec<String>),
    /// A full-width line (a group title).
    Title(String),
}

impl Table {
    /// A table with these columns.
    pub fn new(columns: &[(&str, Align)]) -> Self {
        Self {
            headers: columns.iter().map(|(h, _)| h.to_string()).collect(),
            align: columns.iter().map(|(_, a)| *a).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (missing cells are blank).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(Row::Cells(cells));
    }

    /// Appends a title line spanning the table.
    pub fn title(&mut self, title: impl Into<String>) {
        self.rows.push(Row::Title(title.into()));
    }

    /// The table as text, one line per row, header and rule first.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            if let Row::Cells(cells) = row {
                for (i, c) in cells.iter().enumerate().take(widths.len()) {
                    widths[i] = widths[i].max(c.chars().count());
                }
            }
        }
        let line = |cells: &[String]| -> String {
            let mut out = String::new();
            for (i, w) in widths.iter().enumerate() {
                let cell = cells.get(i).map(String::as_str).unwrap_or("");
                let pad = w.saturating_sub(cell.chars().count());
                if i > 0 {
                    out.push_str("  ");
                }
                match self.align[i] {
                    Align::Left => {
                        out.push_str(cell);
                        out.push_str(&" ".repeat(pad));
                    }
                    Align::Right => {
                        out.push_str(&" ".repeat(pad));
                        out.push_str(cell);
                    }
                }
            }
            out.trim_end().to_string()
        };
        let total: usize = widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
        let mut out = String::new();
        out.push_str(&line(&self.headers));
        out.push('\n');
        out.push_str(&"-".repeat(total));
        out.push('\n');
        for row in &self.rows {
            match row {
                Row::Cells(cells) => out.push_str(&line(cells)),
                Row::Title(t) => out.push_str(t),
            }
            out.push('\n');
        }
        out
    }
}

/// A number in scientific notation for error columns (`0` stays `0`, infinities `inf`).
pub fn sci(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x.is_infinite() {
        "inf".into()
    } else if x.is_nan() {
        "nan".into()
    } else {
        format!("{x:.2e}")
    }
}

/// A number with `decimals` digits after the point, `-` when absent or NaN.
pub fn num(x: Option<f64>, decimals: usize) -> String {
    match x {
        Some(v) if v.is_finite() => format!("{v:.decimals$}"),
        _ => "-".into(),
    }
}
