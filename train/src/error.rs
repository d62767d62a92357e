//! Errors of the SFT job. Data errors name the file and the line, checkpoint errors the
//! file and the field, so the message alone says what to fix.

use std::path::{Path, PathBuf};

/// A problem with one line of the training data.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// The line is not a JSON object.
    #[error("{source_name}:{line}: not a JSON object: {message}")]
    InvalidJson {
        /// The data file.
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// The parser's message.
        message: String,
    },
    /// A required field is absent (or null).
    #[error(
        "{source_name}:{line}: missing field `{field}` (rows are {{\"instruction\", \"input\" (optional), \"output\"}} or {{\"text\"}})"
    )]
    MissingField {
        /// The data file.
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// The field.
        field: &'static str,
    },
    /// A field has the wrong JSON type, or the row mixes the two row kinds.
    #[error("{source_name}:{line}: field `{field}`: {message}")]
    BadField {
        /// The data file.
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// The field.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The tokenizer failed on the row's text.
    #[error("{source_name}:{line}: the tokenizer failed: {message}")]
    Tokenize {
        /// The data file.
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// The tokenizer's message.
        message: String,
    },
    /// The tokenized example is longer than `--max-length`.
    #[error(
        "{source_name}:{line}: example is {tokens} tokens, longer than --max-length {max_length} ({hint})"
    )]
    TooLong {
        /// The data file.
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// Its length in tokens (bos, prompt, response, eos).
        tokens: usize,
        /// The limit.
        max_length: usize,
        /// What the policy did or what to do.
        hint: &'static str,
    },
}

impl LineError {
    /// 1-based line number of the error.
    pub fn line(&self) -> usize {
        match self {
            LineError::InvalidJson { line, .. }
            | LineError::MissingField { line, .. }
            | LineError::BadField { line, .. }
            | LineError::Tokenize { line, .. }
            | LineError::TooLong { line, .. } => *line,
        }
    }
}

/// What stopped a training run, or its preparation.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// A bad data line under `--on-bad-line fail` or `--on-too-long fail`.
    #[error(transparent)]
    Data(#[from] LineError),
    /// Nothing to train on after the policies were applied.
    #[error("{source_name}: no usable example ({detail})")]
    NoData {
        /// The data file.
        source_name: String,
        /// Counts of what was read and skipped.
        detail: String,
    },
    /// The tokenizer file is unusable.
    #[error("{source_name}: {message}")]
    Tokenizer {
        /// The tokenizer file.
        source_name: String,
        /// What is wrong.
        message: String,
    },
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A checkpoint is incomplete, malformed or does not fit this run.
    #[error("{}: {message}", path.display())]
    Checkpoint {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// Loading or saving the model.
    #[error(transparent)]
    Model(#[from] liger_models::ModelError),
    /// Bad settings (flags).
    #[error("{0}")]
    Config(String),
    /// The loss or the gradient norm was not finite; the last good state was saved.
    #[error("step {step}: the {what} is {value}; stopped{saved}")]
    NonFinite {
        /// The step that produced it.
        step: usize,
        /// `loss` or `gradient norm`.
        what: &'static str,
        /// The value (NaN or inf).
        value: f64,
        /// Where the last good state went, in words.
        saved: String,
    },
    /// A step panicked (a kernel or device error); the last good state was saved.
    #[error("step {step} panicked: {message}; stopped{saved}")]
    Panicked {
        /// The step.
        step: usize,
        /// The panic message.
        message: String,
        /// Where the last good state went, in words.
        saved: String,
    },
}

impl TrainError {
    /// An I/O error on `path`.
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        TrainError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    /// A checkpoint error on `path`.
    pub fn checkpoint(path: &Path, message: impl Into<String>) -> Self {
        TrainError::Checkpoint {
            path: path.to_path_buf(),
            message: message.into(),
        }
    }
}
