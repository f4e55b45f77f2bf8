//! Builds vcpu_sched's sources (`../src`) as the simulator's twin: `--cfg
//! sim` swaps the sync layer for its reporting wrappers and compiles
//! `exec::sim`. A cfg set here reaches this package only, so no build of
//! the plain `vcpu_sched` (the one `vmm` links) can get it by feature
//! unification. The cfg is declared for check-cfg in the workspace's lints.

fn main() {
    println!("cargo:rustc-cfg=sim");
    println!("cargo:rerun-if-changed=build.rs");
}
