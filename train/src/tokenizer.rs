//! The tokenizer of a training run: a Hugging Face `tokenizer.json` plus the special token
//! ids the prompt template needs (beginning and end of sequence, padding).
//!
//! Text is always encoded *without* the tokenizer's own post-processor (no automatic
//! `<|begin_of_text|>` etc.): the prompt code adds `bos`/`eos` itself, so the token
//! sequence is the same whichever tokenizer family is used and the prompt/response
//! boundary is exact.

use crate::error::TrainError;
use std::path::Path;
use std::str::FromStr;

/// Special token ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SpecialTokens {
    /// Prepended to every example when the tokenizer has one (Qwen has none).
    pub bos: Option<u32>,
    /// Appended to every example, and trained: the model learns to stop.
    pub eos: u32,
    /// Input id at padded positions (their labels are -100, so the value never matters
    /// for the loss; the pad token when there is one, else `eos`).
    pub pad: u32,
}

/// Names under which tokenizer families store their specials, most common first.
const BOS_NAMES: [&str; 4] = ["<bos>", "<s>", "<|begin_of_text|>", "<|startoftext|>"];
const EOS_NAMES: [&str; 5] = [
    "<eos>",
    "</s>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<|im_end|>",
];
const PAD_NAMES: [&str; 4] = ["<pad>", "<|pad|>", "<|finetune_right_pad_id|>", "[PAD]"];

/// A loaded tokenizer.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    /// Where it came from (file path or `bundled tokenizer.json`), for messages.
    pub source: String,
    /// The JSON it was read from, written unchanged into every checkpoint.
    pub json: String,
    /// Its special tokens.
    pub specials: SpecialTokens,
}

impl TextTokenizer {
    /// Reads `path` (a `tokenizer.json`). Special tokens are found by name (see
    /// [`TextTokenizer::from_json`]); `ids` overrides them (from a model's `config.json`).
    pub fn from_file(path: &Path, ids: SpecialIds) -> Result<Self, TrainError> {
        let json = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
        Self::from_json(json, &path.display().to_string(), ids)
    }

    /// Parses a `tokenizer.json` text. `bos`/`eos`/`pad` come from `ids` where given,
    /// else from the vocabulary by their usual names (`<bos>`, `<s>`,
    /// `<|begin_of_text|>`; `<eos>`, `</s>`, `<|end_of_text|>`, `<|endoftext|>`,
    /// `<|im_end|>`; `<pad>`, ...). An end-of-sequence token is required.
    pub fn from_json(json: String, source: &str, ids: SpecialIds) -> Result<Self, TrainError> {
        let inner = tokenizers::Tokenizer::from_str(&json).map_err(|e| TrainError::Tokenizer {
            source_name: source.to_string(),
            message: format!("not a valid tokenizer.json: {e}"),
        })?;
        let find = |names: &[&str]| names.iter().find_map(|n| inner.token_to_id(n));
        let eos = ids
            .eos
            .or_else(|| find(&EOS_NAMES))
            .ok_or_else(|| TrainError::Tokenizer {
                source_name: source.to_string(),
                message: format!(
                    "no end-of-sequence token: none of {EOS_NAMES:?} is in the vocabulary and the \
                 model's config.json has no eos_token_id"
                ),
            })?;
        let bos = ids.bos.or_else(|| find(&BOS_NAMES));
        let pad = ids.pad.or_else(|| find(&PAD_NAMES)).unwrap_or(eos);
        Ok(TextTokenizer {
            inner,
            source: source.to_string(),
            json,
            specials: SpecialTokens { bos, eos, pad },
        })
    }

    /// Token ids of `text`, without special tokens added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        self.inner
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }

    /// Text of `ids` (special tokens kept), for messages and tests.
    pub fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.inner.decode(ids, false).map_err(|e| e.to_string())
    }

    /// Vocabulary size including added tokens: the smallest model `vocab_size` that
    /// holds every id it produces.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Id of `token`, if it is in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }
}

/// Special token ids given explicitly (e.g. a checkpoint's `config.json` `bos_token_id`,
/// `eos_token_id`, `pad_token_id`); `None` = look the token up by name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecialIds {
    /// Beginning of sequence.
    pub bos: Option<u32>,
    /// End of sequence.
    pub eos: Option<u32>,
    /// Padding.
    pub pad: Option<u32>,
}

impl SpecialIds {
    /// The ids in a Hugging Face `config.json` object (`eos_token_id` may be a list: the
    /// first is taken).
    pub fn from_hf_config(extra: &serde_json::Map<String, serde_json::Value>) -> Self {
        let id = |key: &str| -> Option<u32> {
            match extra.get(key)? {
                serde_json::Value::Array(a) => a.first()?.as_u64().map(|v| v as u32),
                v => v.as_u64().map(|v| v as u32),
            }
        };
        SpecialIds {
            bos: id("bos_token_id"),
            eos: id("eos_token_id"),
            pad: id("pad_token_id"),
        }
    }
}
