//! The prompt template and the loss mask: which tokens of an example are trained.
//!
//! An instruction row becomes
//!
//! ```text
//! <bos>### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n | {output}<eos>
//! ```
//!
//! (the `### Input` block only when `input` is present and not empty). Everything left of
//! `|` is the prompt, masked out of the loss (label -100); the output and `<eos>` are
//! trained, so the model learns to answer and to stop. A `{"text"}` row is trained whole:
//! `<bos>` masked, the text and `<eos>` trained.
//!
//! Prompt and response are tokenized separately and concatenated, so no token straddles
//! the boundary and the mask is exact (tokenizing the joined string could merge the
//! prompt's last characters with the response's first ones).

use crate::tokenizer::TextTokenizer;
use liger_models::IGNORE_INDEX;

/// One row of the data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Row {
    /// An instruction with an optional input and the expected output.
    Instruction {
        /// The task.
        instruction: String,
        /// Context for the task; `None` when absent or null.
        input: Option<String>,
        /// The response to train on.
        output: String,
    },
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
}

/// The prompt of an instruction row, as a string (without `<bos>`).
pub fn instruction_prompt(instruction: &str, input: Option<&str>) -> String {
    match input.filter(|i| !i.is_empty()) {
        Some(input) => {
            format!("### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")
        }
        None => format!("### Instruction:\n{instruction}\n\n### Response:\n"),
    }
}

/// The two parts of a row: `(prompt, response)`; the prompt is empty for text rows.
pub fn split_row(row: &Row) -> (String, &str) {
    match row {
        Row::Instruction {
            instruction,
            input,
            output,
        } => (instruction_prompt(instruction, input.as_deref()), output),
        Row::Text { text } => (String::new(), text),
    }
}

/// One tokenized example: `input_ids` and `labels` of equal length, labels `-100` where
/// the token is not trained.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tokenized {
    /// `[bos] + prompt + response + [eos]`.
    pub input_ids: Vec<u32>,
    /// `-100` on bos and the prompt, the token id on the response and eos.
    pub labels: Vec<i64>,
    /// 1-based line of the data file it came from.
    pub line: usize,
}

impl Tokenized {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    /// Whether it has no token.
    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }

    /// Number of trained tokens (labels other than -100). The first label is never
    /// predicted (nothing precedes it), so it is always masked.
    pub fn trained(&self) -> usize {
        self.labels.iter().filter(|&&l| l != IGNORE_INDEX).count()
    }

    /// Keeps the first `max_length` tokens.
    pub fn truncate(&mut self, max_length: usize) {
        self.input_ids.truncate(max_length);
        self.labels.truncate(max_length);
    }
}

/// Tokenizes `row` with the template and the mask above. Errors with the tokenizer's message.
pub fn tokenize_row(tok: &TextTokenizer, row: &Row, line: usize) -> Result<Tokenized, String> {
    let (prompt, response) = split_row(row);
    tokenize_parts(tok, &prompt, response, line)
}

/// `[bos] + prompt + response + [eos]` with the mask above: the prompt as given (the
/// preference and KTO formats carry their prompt whole), tokenized apart from the response.
pub fn tokenize_parts(
    tok: &TextTokenizer,
    prompt: &str,
    response: &str,
    line: usize,
) -> Result<Tokenized, String> {
    let prompt_ids = if prompt.is_empty() {
        Vec::new()
    } else {
        tok.encode(prompt)?
    };
    let response_ids = tok.encode(response)?;
    let specials = tok.specials;
    let mut input_ids = Vec::with_capacity(prompt_ids.len() + response_ids.len() + 2);
    let mut labels = Vec::with_capacity(input_ids.capacity());
    let mut push = |id: u32, trained: bool| {
        input_ids.push(id);
        labels.push(if trained { id as i64 } else { IGNORE_INDEX });
    };
    if let Some(bos) = specials.bos {
        push(bos, false);
    }
    for &id in &prompt_ids {
        push(id, false);
    }
    for &id in &response_ids {
        push(id, true);
    }
    push(specials.eos, true);
    // Without bos, a text row's first token would be labelled but never predicted; mask
    // it so `trained()` counts exactly the tokens the loss sees.
    labels[0] = IGNORE_INDEX;
    Ok(Tokenized {
        input_ids,
        labels,
        line,
    })
}
