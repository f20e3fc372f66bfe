//! The one way the node writes a small file of its data directory that
//! must never be seen half written (`stream-id`, `writer.key`,
//! `peer-memory`).

use std::io::Write;
use std::path::Path;

/// Writes `bytes` as `dir/name`: into `name.tmp` beside it (created anew
/// with `mode` on unix; one a crash left is replaced), synced, renamed into
/// place, and the directory synced. A crash leaves either no file or the
/// whole file.
pub(crate) fn write_aside_and_rename(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    mode: u32,
) -> std::io::Result<()> {
    let temp = dir.join(format!("{name}.tmp"));
    match std::fs::remove_file(&temp) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
        _ => {}
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(&temp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&temp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}
