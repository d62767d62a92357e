//! `liger check --op`: which ops a filter selects.

use liger_verify::conformance::{Op, selects};

#[test]
fn a_filter_selects_by_substring_or_exact_name() {
    let picked = |filter: Option<&str>| -> Vec<&str> {
        Op::ALL
            .iter()
            .map(|op| op.name())
            .filter(|name| selects(filter, name))
            .collect()
    };
    assert_eq!(picked(None).len(), Op::ALL.len());
    assert_eq!(picked(Some("=cross_entropy")), ["cross_entropy"]);
    let substring = picked(Some("cross_entropy"));
    assert!(substring.contains(&"fused_linear_cross_entropy_none"));
    assert!(substring.len() > 5);
    assert_eq!(
        picked(Some("=fused_linear_cross_entropy")),
        ["fused_linear_cross_entropy"]
    );
    assert!(picked(Some("=cross_entropy_")).is_empty());
}
