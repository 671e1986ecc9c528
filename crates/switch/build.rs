//! Compiles the eBPF programs in `bpf/` (C, see docs/switch.md "eBPF") with clang into
//! `$OUT_DIR/<name>.o`, which the switch embeds and loads with aya. Without clang the build
//! still succeeds: each object is left empty and the switch says, when it needs a program,
//! that the programs were not built (scripts/setup.sh installs clang). A program that clang
//! refuses fails the build.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let dir = Path::new("bpf");
    println!("cargo:rerun-if-changed=bpf");
    println!("cargo:rerun-if-env-changed=CLANG");
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    let have_clang = Command::new(&clang)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let mut sources: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("crates/switch/bpf exists")
        .map(|e| e.expect("readable bpf/ entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".bpf.c"))
        .collect();
    sources.sort();
    for src in sources {
        let name = src
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace(".bpf.c", ".o");
        let obj = out.join(&name);
        if !have_clang {
            std::fs::write(&obj, b"").expect("write an empty object");
            continue;
        }
        let status = Command::new(&clang)
            .args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror", "-c"])
            .arg(&src)
            .arg("-o")
            .arg(&obj)
            .status()
            .expect("run clang");
        assert!(status.success(), "clang failed on {}", src.display());
    }
    if !have_clang {
        println!(
            "cargo:warning=clang not found: the eBPF programs (AF_XDP ports, softirq \
             accounting) are not built; install clang (scripts/setup.sh) and rebuild"
        );
        // Build again once clang appears (a path that does not exist is always stale).
        println!("cargo:rerun-if-changed=/usr/bin/clang");
    }
}
