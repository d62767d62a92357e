//! The training methods of `liger train --method`: supervised fine-tuning, the preference
//! losses (DPO, ORPO, CPO, SimPO), KTO and distillation, each one liger-burn fused op over
//! the model's last hidden states and output head, so no method holds the `[rows, seq, V]`
//! logits.
//!
//! The data of each ([`crate::data`]): SFT rows; TRL's `{"prompt", "chosen", "rejected"}`
//! for the preference losses (a micro-batch holds `batch_size` pairs: the chosen sequences,
//! then the rejected ones); TRL's `{"prompt", "completion", "label"}` for KTO; SFT rows for
//! distillation, whose teacher (`--teacher`) reads the same tokens. DPO and KTO compare to a
//! reference model, the policy as it was before the first step, frozen; distillation to
//! the teacher, frozen. Both run on the inner (non-autodiff) backend, in the policy's
//! dtype: no graph, no gradient.

use burn::tensor::{Int, Tensor};
use liger_burn::functional::{self, Reference};
use liger_burn::ops::{
    DistillOptions, DpoLossType, FusedOps, KtoOptions, PreferenceLoss, PreferenceOptions,
};
use liger_models::CausalLm;
use serde::{Deserialize, Serialize};

/// What a run trains, with the options of its loss.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MethodConfig {
    /// Supervised fine-tuning: the next-token cross entropy of the trained tokens.
    #[default]
    Sft,
    /// A preference loss (DPO, ORPO, CPO, SimPO) on pairs.
    Preference(PreferenceOptions),
    /// KTO on unpaired, labelled completions.
    Kto(KtoOptions),
    /// Distillation from a frozen teacher.
    Distill(DistillOptions),
}

impl MethodConfig {
    /// The method's name, as `--method` takes it.
    pub fn name(&self) -> &'static str {
        match self {
            MethodConfig::Sft => "sft",
            MethodConfig::Preference(o) => o.loss.name(),
            MethodConfig::Kto(_) => "kto",
            MethodConfig::Distill(_) => "distill",
        }
    }

    /// Whether the data are pairs (a micro-batch's rows: the chosen then the rejected
    /// sequences).
    pub fn paired(&self) -> bool {
        matches!(self, MethodConfig::Preference(_))
    }

    /// Whether the loss needs a frozen model: the reference (DPO, KTO) or the teacher.
    pub fn needs_frozen(&self) -> bool {
        match self {
            MethodConfig::Sft => false,
            MethodConfig::Preference(o) => o.loss.uses_reference(),
            MethodConfig::Kto(_) | MethodConfig::Distill(_) => true,
        }
    }

    /// The names of the method's metrics beside the loss (TRL's), in the order
    /// [`micro_batch_loss`] returns them.
    pub fn metric_names(&self) -> Vec<String> {
        let names: &[&str] = match self {
            MethodConfig::Sft => &[],
            MethodConfig::Preference(o) => {
                if matches!(o.loss, PreferenceLoss::Orpo) {
                    &PREFERENCE_ORPO
                } else {
                    &PREFERENCE[..]
                }
            }
            MethodConfig::Kto(_) => &KTO,
            MethodConfig::Distill(_) => &["soft_loss", "hard_loss"],
        };
        names.iter().map(|n| n.to_string()).collect()
    }

    /// The defaults of `--method name` (Liger-Kernel's for each loss), `None` for an
    /// unknown name.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "sft" => MethodConfig::Sft,
            "dpo" => MethodConfig::Preference(PreferenceOptions::dpo()),
            "orpo" => MethodConfig::Preference(PreferenceOptions::orpo()),
            "cpo" => MethodConfig::Preference(PreferenceOptions::cpo()),
            "simpo" => MethodConfig::Preference(PreferenceOptions::simpo()),
            "kto" => MethodConfig::Kto(KtoOptions::default()),
            "distill" => MethodConfig::Distill(DistillOptions::default()),
            _ => return None,
        })
    }

    /// What is wrong with the options, if anything.
    pub fn check(&self) -> Result<(), String> {
        match self {
            MethodConfig::Sft => Ok(()),
            MethodConfig::Preference(o) => o.check(),
            MethodConfig::Kto(o) => o.check(),
            MethodConfig::Distill(o) => o.check(),
        }
    }
}

const PREFERENCE: [&str; 9] = [
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "logits/chosen",
    "logits/rejected",
    "nll_loss",
];

const PREFERENCE_ORPO: [&str; 11] = [
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "logits/chosen",
    "logits/rejected",
    "nll_loss",
    "log_odds_ratio",
    "log_odds_chosen",
];

const KTO: [&str; 7] = [
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "logits/chosen",
    "logits/rejected",
];

/// A DPO loss type by TRL's name.
pub fn dpo_loss_type(name: &str) -> Option<DpoLossType> {
    DpoLossType::from_name(name)
}

/// One micro-batch of `[rows, seq]` token ids and labels (`-100` untrained), for the
/// methods other than SFT: the loss (`[1]`, tracked) and the method's metrics, in
/// [`MethodConfig::metric_names`]' order. `desirable` are KTO's labels per row; `frozen`
/// the reference or teacher.
pub fn micro_batch_loss<B: FusedOps + burn::tensor::backend::AutodiffBackend>(
    method: &MethodConfig,
    model: &CausalLm<B>,
    frozen: Option<&CausalLm<B::InnerBackend>>,
    ids: Tensor<B, 2, Int>,
    labels: Tensor<B, 2, Int>,
    desirable: Option<Tensor<B, 1, Int>>,
) -> (Tensor<B, 1>, Vec<f64>)
where
    B::InnerBackend: FusedOps,
{
    let [rows, seq] = ids.dims();
    // Position t predicts the label of t + 1: the last position predicts nothing.
    let hidden = model.hidden_states(ids.clone()).narrow(1, 0, seq - 1);
    let targets = labels.narrow(1, 1, seq - 1);
    let frozen_head = || {
        let f = frozen.expect("a frozen reference or teacher model for this method");
        let h = f.hidden_states(ids.clone().inner()).narrow(1, 0, seq - 1);
        (
            Tensor::<B, 3>::from_inner(h),
            Tensor::<B, 2>::from_inner(f.lm_head_weight()),
        )
    };
    match method {
        MethodConfig::Sft => unreachable!("SFT trains through CausalLm::loss"),
        MethodConfig::Preference(options) => {
            let reference = if options.loss.uses_reference() {
                let (x, weight) = frozen_head();
                Reference::Model {
                    x,
                    weight,
                    bias: None,
                }
            } else {
                Reference::None
            };
            let out = functional::fused_linear_preference(
                hidden,
                model.lm_head_weight(),
                None,
                targets,
                reference,
                *options,
            );
            let metrics = out.metrics.to_trl().into_iter().map(|(_, v)| v).collect();
            (out.loss, metrics)
        }
        MethodConfig::Kto(options) => {
            let (x, weight) = frozen_head();
            let out = functional::fused_linear_kto(
                hidden,
                model.lm_head_weight(),
                None,
                targets,
                desirable.expect("KTO's labels"),
                Reference::Model {
                    x,
                    weight,
                    bias: None,
                },
                None,
                *options,
            );
            let metrics = out.metrics.to_trl().into_iter().map(|(_, v)| v).collect();
            (out.loss, metrics)
        }
        MethodConfig::Distill(options) => {
            let (tx, tw) = frozen_head();
            let h = hidden.dims()[2];
            let n = rows * (seq - 1);
            let th = tx.dims()[2];
            let out = functional::fused_linear_distill(
                hidden.reshape([n, h]),
                model.lm_head_weight(),
                None,
                tx.reshape([n, th]),
                tw,
                None,
                targets.reshape([n]),
                *options,
            );
            let values = Tensor::cat(vec![out.soft_loss, out.hard_loss], 0)
                .into_data()
                .iter::<f64>()
                .collect();
            (out.loss, values)
        }
    }
}
