//! Reports what the test device offers (plane ops, plane width, dtypes), so a run's log
//! says which reduction paths the kernel suites actually exercised.

#[cfg(any(feature = "vulkan", feature = "wgpu"))]
#[test]
fn report_wgpu_device_features() {
    use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};
    use burn_cubecl::cubecl::{Runtime, features::Plane};
    if liger_tests::device_name() != "wgpu-cpu" {
        return;
    }
    let client = WgpuRuntime::client(&WgpuDevice::Cpu);
    let hw = &client.properties().hardware;
    let plane = client.features().plane.contains(Plane::Ops);
    eprintln!(
        "wgpu-cpu: plane ops {plane}, plane size {}..{}, max units per cube {}",
        hw.plane_size_min, hw.plane_size_max, hw.max_units_per_cube
    );
    // CubeCL hides subgroups on CPU adapters (lavapipe), so `Auto` picks the shared path
    // there; the suites force `ReductionPath::Plane` to run the plane path at this
    // device's plane width (8 on lavapipe) as well.
    assert!(hw.plane_size_max >= 1, "the device reports no plane width");
}
