//! CUDA's stream-ordered memory pool, which serves CubeCL's allocations on CUDA
//! (cubecl-cuda 0.10 allocates every buffer with `cuMemAllocAsync` on its stream and frees
//! it with `cuMemFreeAsync`, so the device's current memory pool holds what CubeCL gives
//! back until the pool trims it).
//!
//! What this module changes is a property of this process's pool object, never of the card:
//! its release threshold (how much unused memory it keeps across synchronizations). Its
//! reads are the pool's own counters, i.e. the device memory CubeCL's allocations take,
//! comparable to PyTorch's `max_memory_reserved`.

use cudarc::driver::sys::{self, CUmemPool_attribute, CUmemoryPool, CUresult};

/// The current memory pool of CUDA device `ordinal`. CUDA must be initialized (a CubeCL
/// client of the device exists).
fn pool(ordinal: usize) -> Result<CUmemoryPool, String> {
    let device = cudarc::driver::result::device::get(ordinal as i32)
        .map_err(|e| format!("CUDA device {ordinal}: {e}"))?;
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer and `device` a device handle from the driver.
    check(
        unsafe { sys::cuDeviceGetMemPool(&mut pool, device) },
        "cuDeviceGetMemPool",
    )?;
    Ok(pool)
}

fn check(result: CUresult, call: &str) -> Result<(), String> {
    match result {
        CUresult::CUDA_SUCCESS => Ok(()),
        other => Err(format!("{call} failed: {other:?}")),
    }
}

fn set(pool: CUmemoryPool, attr: CUmemPool_attribute, mut value: u64) -> Result<(), String> {
    // SAFETY: every attribute set here takes a `cuuint64_t`.
    check(
        unsafe { sys::cuMemPoolSetAttribute(pool, attr, (&mut value as *mut u64).cast()) },
        "cuMemPoolSetAttribute",
    )
}

fn get(pool: CUmemoryPool, attr: CUmemPool_attribute) -> Result<u64, String> {
    let mut value = 0u64;
    // SAFETY: every attribute read here is a `cuuint64_t`.
    check(
        unsafe { sys::cuMemPoolGetAttribute(pool, attr, (&mut value as *mut u64).cast()) },
        "cuMemPoolGetAttribute",
    )?;
    Ok(value)
}

/// Makes device `ordinal`'s pool keep the memory freed into it instead of returning it to
/// the device at each synchronization (release threshold: unlimited). Memory CubeCL hands
/// back (`memory_cleanup`) is then reused by later allocations of any size without a new
/// mapping; [`trim`] returns it.
pub fn keep_freed_memory(ordinal: usize) -> Result<(), String> {
    set(
        pool(ordinal)?,
        CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
        u64::MAX,
    )
}

/// Returns the pool's unused memory to the device and restarts its high-water mark from
/// what it holds now.
pub fn trim(ordinal: usize) -> Result<(), String> {
    let pool = pool(ordinal)?;
    // SAFETY: `pool` is the device's pool handle.
    check(unsafe { sys::cuMemPoolTrimTo(pool, 0) }, "cuMemPoolTrimTo")?;
    // Only 0 is accepted: the mark restarts at the current value.
    set(
        pool,
        CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
        0,
    )?;
    set(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0)
}

/// What device `ordinal`'s pool holds, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CudaPoolUsage {
    /// Device memory the pool holds now.
    pub reserved: u64,
    /// The most it held since the last [`trim`] (or the process start).
    pub reserved_high: u64,
    /// The most its allocations took at once since then.
    pub used_high: u64,
}

/// Reads device `ordinal`'s pool counters.
pub fn usage(ordinal: usize) -> Result<CudaPoolUsage, String> {
    let pool = pool(ordinal)?;
    Ok(CudaPoolUsage {
        reserved: get(
            pool,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
        )?,
        reserved_high: get(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
        used_high: get(pool, CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
    })
}
