//! Errors of loading, saving and evaluating. Every variant names the file, the field or the
//! tensor concerned, so the message alone says what to fix.

use std::path::{Path, PathBuf};

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file that must exist does not.
    #[error("{}: file not found ({what})", path.display())]
    MissingFile {
        /// The path looked for.
        path: PathBuf,
        /// What the file is for.
        what: String,
    },
    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// `config.json` (or an index file) is malformed or asks for something unsupported.
    #[error("{path}: {message}")]
    Config {
        /// The file (or "built in code").
        path: String,
        /// What is wrong.
        message: String,
    },
    /// `model_type` names an architecture this crate does not implement.
    #[error(
        "{path}: unknown model_type {found:?} (supported: \"llama\", \"qwen2\", \"qwen3\", \"mistral\")"
    )]
    UnknownModelType {
        /// The `config.json`.
        path: String,
        /// The `model_type` found.
        found: String,
    },
    /// A safetensors file could not be parsed.
    #[error("{}: not a valid safetensors file: {message}", path.display())]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// The checkpoint lacks a tensor the model needs.
    #[error("tensor `{name}` (shape {expected:?}) is missing from {location}")]
    MissingTensor {
        /// Hugging Face name, e.g. `model.layers.0.self_attn.q_proj.weight`.
        name: String,
        /// The shape it should have.
        expected: Vec<usize>,
        /// Where it was looked for (file or index).
        location: String,
    },
    /// A tensor has the wrong shape for the configuration.
    #[error("tensor `{name}` in {}: expected shape {expected:?} (from config.json), found {actual:?}", file.display())]
    ShapeMismatch {
        /// Hugging Face name.
        name: String,
        /// The file holding it.
        file: PathBuf,
        /// Shape the configuration implies (Hugging Face layout, `[out, in]` for linears).
        expected: Vec<usize>,
        /// Shape in the file.
        actual: Vec<usize>,
    },
    /// A tensor's dtype cannot be read.
    #[error("tensor `{name}` in {}: dtype {dtype} is not supported (F32, F16 and BF16 are)", file.display())]
    UnsupportedDtype {
        /// Hugging Face name.
        name: String,
        /// The file holding it.
        file: PathBuf,
        /// The safetensors dtype.
        dtype: String,
    },
    /// Bad input to a model function (token ids, lengths).
    #[error("{0}")]
    Input(String),
}

impl ModelError {
    /// An I/O error on `path`; a missing file becomes [`ModelError::MissingFile`].
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            ModelError::MissingFile {
                path: path.to_path_buf(),
                what: "needed to load the model".into(),
            }
        } else {
            ModelError::Io {
                path: path.to_path_buf(),
                source,
            }
        }
    }
}
