//! Integration suite of liger-train: SFT data, masking, batching, the training loop, checkpoints and resume.

mod data;
mod lora;
mod methods;
mod training;
