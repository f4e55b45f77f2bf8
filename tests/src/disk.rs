//! ext4 images for the block tests, made and checked by e2fsprogs
//! (`mke2fs -d`, `e2fsck -fn`): tools nobody here wrote.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A 32 MiB ext4 image `DIR/root.img` (label `vmmroot`) holding
/// `/etc/hostname`, built with `mke2fs -d`.
pub fn mkfs_ext4(dir: &Path) -> PathBuf {
    let content = dir.join("content");
    std::fs::create_dir_all(content.join("etc")).unwrap();
    std::fs::write(content.join("etc/hostname"), "vmm-guest\n").unwrap();
    let img = dir.join("root.img");
    let out = Command::new("mke2fs")
        .args(["-q", "-F", "-t", "ext4", "-L", "vmmroot", "-d"])
        .arg(&content)
        .arg(&img)
        .arg("32M")
        .output()
        .expect("mke2fs (e2fsprogs; scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "mke2fs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    img
}

/// Fails the test unless `e2fsck -fn IMG` finds the filesystem clean.
pub fn e2fsck(img: &Path) {
    let out = Command::new("e2fsck")
        .arg("-fn")
        .arg(img)
        .output()
        .expect("e2fsck (e2fsprogs; scripts/setup.sh installs it)");
    assert!(
        out.status.success(),
        "e2fsck -fn failed ({:?}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
