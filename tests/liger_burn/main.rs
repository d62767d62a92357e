//! Integration suite of liger-burn: one module per fused op (forward and every gradient against f64 and stock Burn, on the test device), plus the decorator, records and validation.

mod adamw;
mod attention;
mod cross_entropy;
mod decorator;
mod device_info;
mod fallback_precision;
mod fused_add_rms_norm;
mod fused_linear_cross_entropy;
mod geglu;
mod gelu;
mod layer_norm;
mod log_softmax;
mod lora;
mod matmul;
mod optim;
mod records;
mod rms_norm;
mod rope;
mod sigmoid;
mod softmax;
mod special_values;
mod swiglu;
mod validation;
