//! softmax: forward and every gradient against the f64 reference on every backend of the
//! test device, both reduction paths, every dtype it has.

use liger_verify::conformance::Op;

#[test]
fn softmax_matches_reference() {
    liger_tests::check_op(Op::Softmax);
}
