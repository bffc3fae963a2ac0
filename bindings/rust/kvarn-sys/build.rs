//! Finds libkvarn for the linker, without any crate dependency:
//!
//! 1. `KVARN_LIB_DIR`: a directory holding `libkvarn.so` (a CMake build tree or an install's
//!    libdir);
//! 2. otherwise `pkg-config --libs-only-L kvarn` (the `kvarn.pc` that `cmake --install`
//!    writes; set `PKG_CONFIG_PATH` for a non-system prefix), run as a plain process;
//! 3. otherwise only `-lkvarn`, for a library in the linker's default path.
//!
//! Dependents read the directory found as `DEP_KVARN_LIB_DIR` (empty when none was found).
//! At run time the dynamic loader must find `libkvarn.so.0` too (`LD_LIBRARY_PATH`, rpath or
//! the system library path).

use std::env;
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=KVARN_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_LIBDIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG");

    let mut lib_dirs: Vec<String> = Vec::new();
    match env::var("KVARN_LIB_DIR") {
        Ok(dir) if !dir.is_empty() => {
            if !Path::new(&dir).is_dir() {
                println!("cargo:warning=KVARN_LIB_DIR={dir} is not a directory");
            }
            lib_dirs.push(dir);
        }
        _ => match pkg_config_lib_dirs() {
            Ok(dirs) => lib_dirs = dirs,
            Err(why) => println!(
                "cargo:warning=libkvarn not located ({why}); set KVARN_LIB_DIR or PKG_CONFIG_PATH \
                 if linking fails"
            ),
        },
    }

    for dir in &lib_dirs {
        println!("cargo:rustc-link-search=native={dir}");
    }
    println!("cargo:rustc-link-lib=dylib=kvarn");
    println!(
        "cargo:lib_dir={}",
        lib_dirs.first().map(String::as_str).unwrap_or("")
    );
}

/// The `-L` directories of `pkg-config --libs-only-L kvarn`.
fn pkg_config_lib_dirs() -> Result<Vec<String>, String> {
    let program = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let output = Command::new(&program)
        .args(["--libs-only-L", "kvarn"])
        .output()
        .map_err(|e| format!("could not run {program}: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "{program} --libs-only-L kvarn failed: {}",
            stderr.trim()
        ));
    }
    // Rebuild when that kvarn.pc changes (a reinstall to another prefix).
    if let Ok(dir) = Command::new(&program)
        .args(["--variable=pcfiledir", "kvarn"])
        .output()
    {
        let dir = String::from_utf8_lossy(&dir.stdout).trim().to_string();
        if !dir.is_empty() {
            println!("cargo:rerun-if-changed={dir}/kvarn.pc");
        }
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    Ok(stdout
        .split_whitespace()
        .filter_map(|flag| flag.strip_prefix("-L"))
        .filter(|dir| !dir.is_empty())
        .map(str::to_string)
        .collect())
}
