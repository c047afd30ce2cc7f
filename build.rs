//! Names the cargo profile a binary was built with (`TANDEM_BUILD_PROFILE`: `debug` for the
//! dev profile, `release`), which `tandem --version`, `/v1/status` and the benchmarks report.
//! The dev profile runs without debug assertions, so `cfg!(debug_assertions)` cannot tell.

fn main() {
    let profile = std::env::var("PROFILE").unwrap_or_else(|_| "unknown".to_owned());
    println!("cargo:rustc-env=TANDEM_BUILD_PROFILE={profile}");
    println!("cargo:rerun-if-changed=build.rs");
}
