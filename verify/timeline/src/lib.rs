//! `liger_bench(argc, argv)`: `liger bench` with the given arguments (`argv[0]` is the
//! program name, as for `main`), in the calling process. Returns the exit code, or 2 when
//! the arguments do not parse or the bench fails.
//!
//! Run whole-step cases in this process with `--e2e --e2e-case MODEL:SEQ:BATCH:on|off`:
//! the case runner would otherwise start the cases as child processes of the host program.

use clap::Parser;
use liger_verify::args::BenchArgs;
use std::ffi::{CStr, c_char, c_int};

#[derive(Parser)]
#[command(name = "liger bench")]
struct Bench {
    #[command(flatten)]
    args: BenchArgs,
}

/// # Safety
/// `argv` must point to `argc` valid NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn liger_bench(argc: c_int, argv: *const *const c_char) -> c_int {
    let args: Vec<String> = (0..argc.max(0) as usize)
        // SAFETY: the caller passes `argc` valid C strings.
        .map(|i| {
            unsafe { CStr::from_ptr(*argv.add(i)) }
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    let bench = match Bench::try_parse_from(&args) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{e}");
            return 2;
        }
    };
    match liger_verify::bench::run(bench.args) {
        Ok(code) => {
            if code == std::process::ExitCode::SUCCESS {
                0
            } else {
                1
            }
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            2
        }
    }
}
