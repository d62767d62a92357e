//! Attention's f64 reference, random problems and row-wise comparison, shared with
//! `liger check` (`liger_verify::conformance::attention`).

pub use liger_verify::conformance::attention::{
    Problem, Reference, compare_lse, compare_rows, random_documents, reference, row_tolerance,
};
