//! `--elementwise-geometry` (`liger bench` and `liger check`): what the flag sets, and what it refuses.

use liger_cubecl_kernels::LaunchConfig;
use liger_verify::args::ElementwiseGeometry;

#[test]
fn given_fields_are_set_and_the_others_kept() {
    let default = LaunchConfig::default().elementwise;
    let mut config = default;
    ElementwiseGeometry::parse("units=256,max_cubes=none")
        .unwrap()
        .apply(&mut config);
    assert_eq!(config.units, 256);
    assert_eq!(config.max_cubes, None);
    assert_eq!(config.vectors_per_unit, default.vectors_per_unit);
    assert_eq!(config.max_vector, default.max_vector);

    let mut config = default;
    ElementwiseGeometry::parse("vectors_per_unit=2,max_vector=8,max_cubes=1000")
        .unwrap()
        .apply(&mut config);
    assert_eq!(
        (config.units, config.vectors_per_unit, config.max_vector),
        (default.units, 2, 8)
    );
    assert_eq!(config.max_cubes, Some(1000));

    let mut config = default;
    ElementwiseGeometry::parse("cubes_per_sm=32,hardware_math=on")
        .unwrap()
        .apply(&mut config);
    assert_eq!(
        (config.cubes_per_sm, config.hardware_math),
        (Some(32), true)
    );
    assert_eq!(config.max_cubes, default.max_cubes);
    ElementwiseGeometry::parse("cubes_per_sm=none,hardware_math=off")
        .unwrap()
        .apply(&mut config);
    assert_eq!((config.cubes_per_sm, config.hardware_math), (None, false));
}

#[test]
fn malformed_fields_are_refused_naming_them() {
    for (text, names) in [
        ("units=0", "units"),
        ("units=-4", "units"),
        ("max_cubes=all", "max_cubes"),
        ("cubes=4", "cubes"),
        ("units", "units"),
        ("cubes_per_sm=x", "cubes_per_sm"),
        ("hardware_math=yes", "hardware_math"),
    ] {
        let error = ElementwiseGeometry::parse(text).unwrap_err();
        assert!(error.contains(names), "{text}: {error}");
    }
}
