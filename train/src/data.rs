//! Training data: JSONL rows, line-numbered errors and the policies for bad lines and
//! over-long examples. The whole file is parsed and tokenized before step 1 ([`prepare`]),
//! so a data error never stops a run halfway and loses finished steps.
//!
//! Row kinds, one JSON object per line (blank lines are ignored):
//! - `{"instruction": "...", "input": "...", "output": "..."}`, `input` optional (absent,
//!   null or empty means no input block);
//! - `{"text": "..."}`: plain text, trained whole.
//!
//! Other fields are ignored. A row with both `text` and `instruction` is refused (which
//! kind it is would be a guess).

use crate::error::{LineError, TrainError};
use crate::prompt::{Tokenized, tokenize_parts, tokenize_row};
use crate::tokenizer::TextTokenizer;
use serde_json::{Map, Value};

pub use crate::prompt::Row;

/// A row with its 1-based line number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineRow {
    /// 1-based line number in the file.
    pub line: usize,
    /// The row.
    pub row: Row,
}

/// `--on-bad-line`: what to do with a line that is not a valid row.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BadLinePolicy {
    /// Report it and train on the other lines.
    Skip,
    /// Stop before training, naming the line.
    #[default]
    Fail,
}

/// `--on-too-long`: what to do with an example longer than `--max-length` tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TooLongPolicy {
    /// Keep its first `max_length` tokens (skipped if no trained token is left).
    #[default]
    Truncate,
    /// Report it and leave it out.
    Skip,
    /// Stop before training, naming the line.
    Fail,
}

/// Parses one line (already known not to be blank).
pub fn parse_line(text: &str, source_name: &str, line: usize) -> Result<Row, LineError> {
    let value: Value = serde_json::from_str(text).map_err(|e| LineError::InvalidJson {
        source_name: source_name.to_string(),
        line,
        message: e.to_string(),
    })?;
    let Value::Object(map) = value else {
        return Err(LineError::InvalidJson {
            source_name: source_name.to_string(),
            line,
            message: format!("expected an object, got {}", kind(&value)),
        });
    };
    let field = |name: &'static str| -> Result<Option<String>, LineError> {
        string_field(&map, name).map_err(|message| LineError::BadField {
            source_name: source_name.to_string(),
            line,
            field: name,
            message,
        })
    };
    let missing = |field: &'static str| LineError::MissingField {
        source_name: source_name.to_string(),
        line,
        field,
    };
    let text = field("text")?;
    let instruction = field("instruction")?;
    match (text, instruction) {
        (Some(_), Some(_)) => Err(LineError::BadField {
            source_name: source_name.to_string(),
            line,
            field: "text",
            message: "a row has either `text` or `instruction`/`output`, not both".into(),
        }),
        (Some(text), None) => Ok(Row::Text { text }),
        (None, Some(instruction)) => {
            let output = field("output")?.ok_or_else(|| missing("output"))?;
            Ok(Row::Instruction {
                instruction,
                input: field("input")?,
                output,
            })
        }
        (None, None) => Err(missing(if map.contains_key("output") {
            "instruction"
        } else {
            "instruction` or `text"
        })),
    }
}

/// `map[name]` as a string: `Ok(None)` when absent or null, `Err` for another type.
fn string_field(map: &Map<String, Value>, name: &str) -> Result<Option<String>, String> {
    match map.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("expected a string, got {}", kind(other))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Rows of a JSONL text and the lines skipped under [`BadLinePolicy::Skip`].
#[derive(Clone, Debug, Default)]
pub struct ParsedRows {
    /// The valid rows, in file order.
    pub rows: Vec<LineRow>,
    /// The invalid lines that were skipped.
    pub skipped: Vec<LineError>,
}

/// Parses every line of `text` (`source_name` names the file in errors). With
/// [`BadLinePolicy::Fail`] the first bad line is the error.
pub fn parse_jsonl(
    text: &str,
    source_name: &str,
    policy: BadLinePolicy,
) -> Result<ParsedRows, LineError> {
    let mut out = ParsedRows::default();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match parse_line(line, source_name, i + 1) {
            Ok(row) => out.rows.push(LineRow { line: i + 1, row }),
            Err(e) if policy == BadLinePolicy::Skip => out.skipped.push(e),
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// How to turn a data file into training examples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataOptions {
    /// Longest example, in tokens.
    pub max_length: usize,
    /// Bad lines.
    pub on_bad_line: BadLinePolicy,
    /// Over-long examples.
    pub on_too_long: TooLongPolicy,
}

/// The tokenized examples of a data file and what was left out or cut.
#[derive(Clone, Debug)]
pub struct Dataset {
    /// Where the data came from (file path or `bundled dataset.jsonl`).
    pub source_name: String,
    /// Examples in file order, each at most `max_length` tokens with a trained token.
    pub examples: Vec<Tokenized>,
    /// Lines left out: invalid rows, over-long or emptied examples (with their reason).
    pub skipped: Vec<LineError>,
    /// Lines of over-long examples that were truncated.
    pub truncated: Vec<usize>,
    /// FNV-1a hash of the data text, stored in checkpoints so a resume on other data is refused.
    pub hash: u64,
    /// Preference pairs: `examples[2i]` is pair `i`'s chosen sequence, `examples[2i + 1]`
    /// its rejected one.
    pub paired: bool,
    /// KTO: whether each example is desirable (empty for the other methods).
    pub desirable: Vec<bool>,
}

impl Dataset {
    /// Total tokens of the examples.
    pub fn tokens(&self) -> usize {
        self.examples.iter().map(Tokenized::len).sum()
    }
}

/// Parses and tokenizes the whole of `text` under `opts`; errors (under the `fail`
/// policies) name the file and the line. Also errors when no example is left.
pub fn prepare(
    text: &str,
    source_name: &str,
    tok: &TextTokenizer,
    opts: DataOptions,
) -> Result<Dataset, TrainError> {
    if opts.max_length < 2 {
        return Err(TrainError::Config(format!(
            "--max-length must be at least 2 (a token and the one it predicts), got {}",
            opts.max_length
        )));
    }
    let parsed = parse_jsonl(text, source_name, opts.on_bad_line)?;
    let read = parsed.rows.len() + parsed.skipped.len();
    let mut skipped = parsed.skipped;
    let mut truncated = Vec::new();
    let mut examples = Vec::with_capacity(parsed.rows.len());
    for LineRow { line, row } in parsed.rows {
        let mut ex = match tokenize_row(tok, &row, line) {
            Ok(ex) => ex,
            Err(message) => {
                let e = LineError::Tokenize {
                    source_name: source_name.to_string(),
                    line,
                    message,
                };
                match opts.on_bad_line {
                    BadLinePolicy::Skip => {
                        skipped.push(e);
                        continue;
                    }
                    BadLinePolicy::Fail => return Err(e.into()),
                }
            }
        };
        if ex.len() > opts.max_length {
            let too_long = |hint| LineError::TooLong {
                source_name: source_name.to_string(),
                line,
                tokens: ex.len(),
                max_length: opts.max_length,
                hint,
            };
            match opts.on_too_long {
                TooLongPolicy::Fail => {
                    return Err(too_long(
                        "raise --max-length, or pass --on-too-long truncate|skip",
                    )
                    .into());
                }
                TooLongPolicy::Skip => {
                    skipped.push(too_long("skipped"));
                    continue;
                }
                TooLongPolicy::Truncate => {
                    let e = too_long("truncated, no response token left: skipped");
                    ex.truncate(opts.max_length);
                    if ex.trained() == 0 {
                        skipped.push(e);
                        continue;
                    }
                    truncated.push(line);
                }
            }
        }
        examples.push(ex);
    }
    if examples.is_empty() {
        return Err(TrainError::NoData {
            source_name: source_name.to_string(),
            detail: format!("{read} rows read, {} skipped", skipped.len()),
        });
    }
    Ok(Dataset {
        source_name: source_name.to_string(),
        examples,
        skipped,
        truncated,
        hash: fnv1a(text.as_bytes()),
        paired: false,
        desirable: Vec::new(),
    })
}

/// 64-bit FNV-1a (stable across platforms and Rust versions, unlike `DefaultHasher`).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// The row format a method reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataKind {
    /// Instruction or text rows (SFT, distillation).
    Sft,
    /// TRL's preference rows, `{"prompt", "chosen", "rejected"}`.
    Pairs,
    /// TRL's unpaired rows, `{"prompt", "completion", "label"}` (KTO).
    Labelled,
}

/// A preference or KTO row.
enum PostRow {
    Pair {
        prompt: String,
        chosen: String,
        rejected: String,
    },
    Labelled {
        prompt: String,
        completion: String,
        desirable: bool,
    },
}

fn parse_post_line(
    text: &str,
    source_name: &str,
    line: usize,
    format: DataKind,
) -> Result<PostRow, LineError> {
    let value: Value = serde_json::from_str(text).map_err(|e| LineError::InvalidJson {
        source_name: source_name.to_string(),
        line,
        message: e.to_string(),
    })?;
    let Value::Object(map) = value else {
        return Err(LineError::InvalidJson {
            source_name: source_name.to_string(),
            line,
            message: format!("expected an object, got {}", kind(&value)),
        });
    };
    let field = |name: &'static str| -> Result<String, LineError> {
        string_field(&map, name)
            .map_err(|message| LineError::BadField {
                source_name: source_name.to_string(),
                line,
                field: name,
                message,
            })?
            .ok_or_else(|| LineError::MissingField {
                source_name: source_name.to_string(),
                line,
                field: name,
            })
    };
    match format {
        DataKind::Pairs => Ok(PostRow::Pair {
            prompt: field("prompt")?,
            chosen: field("chosen")?,
            rejected: field("rejected")?,
        }),
        DataKind::Labelled => {
            let desirable = match map.get("label") {
                Some(Value::Bool(b)) => *b,
                None | Some(Value::Null) => {
                    return Err(LineError::MissingField {
                        source_name: source_name.to_string(),
                        line,
                        field: "label",
                    });
                }
                Some(other) => {
                    return Err(LineError::BadField {
                        source_name: source_name.to_string(),
                        line,
                        field: "label",
                        message: format!("expected a boolean, got {}", kind(other)),
                    });
                }
            };
            Ok(PostRow::Labelled {
                prompt: field("prompt")?,
                completion: field("completion")?,
                desirable,
            })
        }
        DataKind::Sft => unreachable!("SFT rows parse with parse_line"),
    }
}

/// The tokenized examples of a preference or KTO file: for pairs, `examples[2i]` is pair
/// `i`'s chosen sequence and `examples[2i + 1]` its rejected one (both kept or both left
/// out); for KTO, [`Dataset::desirable`] holds each example's label. The policies of
/// [`prepare`] apply (an over-long sequence is truncated, or its row skipped or refused).
pub fn prepare_post(
    text: &str,
    source_name: &str,
    tok: &TextTokenizer,
    opts: DataOptions,
    kind: DataKind,
) -> Result<Dataset, TrainError> {
    if kind == DataKind::Sft {
        return prepare(text, source_name, tok, opts);
    }
    if opts.max_length < 2 {
        return Err(TrainError::Config(format!(
            "--max-length must be at least 2 (a token and the one it predicts), got {}",
            opts.max_length
        )));
    }
    let (mut examples, mut desirable, mut skipped, mut truncated) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut read = 0;
    'lines: for (i, text_line) in text.lines().enumerate() {
        if text_line.trim().is_empty() {
            continue;
        }
        read += 1;
        let line = i + 1;
        let fail_or_skip = |e: LineError, skipped: &mut Vec<LineError>| -> Result<(), TrainError> {
            match opts.on_bad_line {
                BadLinePolicy::Skip => {
                    skipped.push(e);
                    Ok(())
                }
                BadLinePolicy::Fail => Err(e.into()),
            }
        };
        let row = match parse_post_line(text_line, source_name, line, kind) {
            Ok(r) => r,
            Err(e) => {
                fail_or_skip(e, &mut skipped)?;
                continue;
            }
        };
        let (prompt, completions, label) = match &row {
            PostRow::Pair {
                prompt,
                chosen,
                rejected,
            } => (prompt, vec![chosen, rejected], None),
            PostRow::Labelled {
                prompt,
                completion,
                desirable,
            } => (prompt, vec![completion], Some(*desirable)),
        };
        let mut row_examples = Vec::new();
        let mut cut = false;
        for completion in completions {
            let mut ex = match tokenize_parts(tok, prompt, completion, line) {
                Ok(ex) => ex,
                Err(message) => {
                    let e = LineError::Tokenize {
                        source_name: source_name.to_string(),
                        line,
                        message,
                    };
                    fail_or_skip(e, &mut skipped)?;
                    continue 'lines;
                }
            };
            if ex.len() > opts.max_length {
                let too_long = |hint| LineError::TooLong {
                    source_name: source_name.to_string(),
                    line,
                    tokens: ex.len(),
                    max_length: opts.max_length,
                    hint,
                };
                match opts.on_too_long {
                    TooLongPolicy::Fail => {
                        return Err(too_long(
                            "raise --max-length, or pass --on-too-long truncate|skip",
                        )
                        .into());
                    }
                    TooLongPolicy::Skip => {
                        skipped.push(too_long("skipped"));
                        continue 'lines;
                    }
                    TooLongPolicy::Truncate => {
                        let e = too_long("truncated, no completion token left: skipped");
                        ex.truncate(opts.max_length);
                        if ex.trained() == 0 {
                            skipped.push(e);
                            continue 'lines;
                        }
                        cut = true;
                    }
                }
            }
            row_examples.push(ex);
        }
        if cut {
            truncated.push(line);
        }
        examples.extend(row_examples);
        desirable.extend(label);
    }
    if examples.is_empty() {
        return Err(TrainError::NoData {
            source_name: source_name.to_string(),
            detail: format!("{read} rows read, {} skipped", skipped.len()),
        });
    }
    Ok(Dataset {
        source_name: source_name.to_string(),
        examples,
        skipped,
        truncated,
        hash: fnv1a(text.as_bytes()),
        paired: kind == DataKind::Pairs,
        desirable,
    })
}
