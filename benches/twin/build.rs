//! Marks the twin's targets with `cfg(twin)`, so that the shared bench
//! files find the twin's helper library (`benches_twin`) under the name
//! `benches`. The cfg is declared for check-cfg in the workspace's lints.

fn main() {
    println!("cargo::rustc-cfg=twin");
}
