//! Integration suite of liger-models: checkpoint loading and saving, parity with transformers, attention.

mod attention;
mod gradient_checkpointing;
mod grads;
mod hf_parity;
mod loading;
mod lora;
mod memory_release;
mod packing;
