//! Evaluation: per-token next-token losses of token sequences of any lengths.

use crate::error::ModelError;
use crate::kernels::IGNORE_INDEX;
use crate::model::CausalLm;
use burn::tensor::{Int, Tensor, TensorData};
use liger_burn::ops::FusedOps;
use serde::{Deserialize, Serialize};

/// Losses of a set of sequences.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    /// Mean of every token loss below (each predicted token weighs the same).
    pub loss: f64,
    /// `token_loss[b][t]`: loss of token `t + 1` of sequence `b` given its tokens `..= t`
    /// (`len(sequence b) - 1` values).
    pub token_loss: Vec<Vec<f32>>,
}

/// Evaluates every sequence in one batch (right-padded to the longest). See
/// [`evaluate_in_batches`].
pub fn evaluate<B: FusedOps>(
    model: &CausalLm<B>,
    input_ids: Vec<Vec<u32>>,
) -> Result<EvalReport, ModelError> {
    let n = input_ids.len().max(1);
    evaluate_in_batches(model, input_ids, n)
}

/// Evaluates the sequences `batch_size` at a time. Each batch is right-padded to its
/// longest sequence with ignored labels; the attention is causal, so padding never changes
/// the losses of real tokens. Uses the model's kernel switches (fused linear cross entropy
/// computes the per-token losses without materializing the logits).
///
/// Errors on an empty input, an empty sequence, no token to predict at all, or a token id
/// outside the vocabulary.
pub fn evaluate_in_batches<B: FusedOps>(
    model: &CausalLm<B>,
    input_ids: Vec<Vec<u32>>,
    batch_size: usize,
) -> Result<EvalReport, ModelError> {
    let vocab = model.config.vocab_size;
    if input_ids.is_empty() {
        return Err(ModelError::Input("evaluate: no sequence given".into()));
    }
    for (b, seq) in input_ids.iter().enumerate() {
        if seq.is_empty() {
            return Err(ModelError::Input(format!(
                "evaluate: sequence {b} is empty"
            )));
        }
        if let Some((t, &id)) = seq
            .iter()
            .enumerate()
            .find(|(_, id)| **id as usize >= vocab)
        {
            return Err(ModelError::Input(format!(
                "evaluate: token {id} at position {t} of sequence {b} is outside the vocabulary \
                 (vocab_size {vocab})"
            )));
        }
    }
    if input_ids.iter().all(|s| s.len() < 2) {
        return Err(ModelError::Input(
            "evaluate: every sequence has a single token; nothing to predict".into(),
        ));
    }
    let device = model.device();
    let mut token_loss = Vec::with_capacity(input_ids.len());
    for chunk in input_ids.chunks(batch_size.max(1)) {
        // At least 2 positions so the shifted loss has a column even if all are 1 long.
        let seq = chunk.iter().map(Vec::len).max().unwrap_or(0).max(2);
        let batch = chunk.len();
        let mut ids = vec![0i64; batch * seq];
        let mut labels = vec![IGNORE_INDEX; batch * seq];
        for (b, s) in chunk.iter().enumerate() {
            for (t, &id) in s.iter().enumerate() {
                ids[b * seq + t] = id as i64;
                labels[b * seq + t] = id as i64;
            }
        }
        let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [batch, seq]), &device);
        let labels = Tensor::<B, 2, Int>::from_data(TensorData::new(labels, [batch, seq]), &device);
        let losses = model
            .token_losses(ids, labels)
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .map_err(|e| ModelError::Input(format!("evaluate: reading losses back: {e:?}")))?;
        for (b, s) in chunk.iter().enumerate() {
            let row = &losses[b * (seq - 1)..(b + 1) * (seq - 1)];
            token_loss.push(row[..s.len().saturating_sub(1)].to_vec());
        }
    }
    let count: usize = token_loss.iter().map(Vec::len).sum();
    let sum: f64 = token_loss.iter().flatten().map(|&l| l as f64).sum();
    Ok(EvalReport {
        loss: sum / count as f64,
        token_loss,
    })
}
