//! The node's writer key: `writer.key` in its data directory, created on
//! the first start (`docs/SIGNING.md`, "Storage, wire and keys on disk").
//!
//! The file holds the key's 32 secret bytes and nothing else. It is
//! created with mode 0600, written aside, synced and renamed into place,
//! so a crash leaves either no key or the whole key. A key file that
//! others may read, or of another size, is refused: the node does not
//! start on a key that may have leaked or been cut.
//!
//! A new data directory writes the stream the key derives, and the node
//! seals it with the key (`crate::replica`, the upgrade policy for
//! directories from before signed streams).
//!
//! The mesh admin's key file (`meshlog key new-admin`) follows the same
//! rules: [`create_admin`], [`load_admin`].

use std::io::Read;
use std::path::{Path, PathBuf};

use meshlog_replica::{AdminKey, SealError, WriterKey};

/// The key file's name in the data directory.
pub const WRITER_KEY_FILE: &str = "writer.key";

/// Why the node's writer key could not be loaded or created. Each variant
/// names the file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// Others than the owner may read or write the key file.
    #[error(
        "{path}: the key file is readable or writable by others (mode {mode:04o}); \
         restrict it with `chmod 600 {path}` (and, if others may have read it, \
         treat the key as leaked)"
    )]
    Exposed {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The key file does not hold exactly the 32 bytes of a key.
    #[error(
        "{path}: a key file holds 32 bytes, this one {len}; restore the key from a backup \
         (a node whose writer.key is deleted becomes a new writer on its next start)"
    )]
    WrongSize {
        /// The key file.
        path: PathBuf,
        /// Its size in bytes.
        len: u64,
    },
    /// The key file could not be read, created or written.
    #[error("{path}: cannot {action} the key: {source}")]
    Io {
        /// The key file (or the temporary file beside it).
        path: PathBuf,
        /// `"read"` or `"write"`.
        action: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// No randomness for a new key.
    #[error("cannot create a key: {0}")]
    Generate(#[from] SealError),
    /// A new key file would replace one that exists.
    #[error("{path}: the file exists; a new key does not replace a key (move it away first)")]
    Exists {
        /// The file.
        path: PathBuf,
    },
}

/// The node's writer key: loaded from `dir`'s `writer.key`, or created
/// there on the first start; with no data directory, a new key for this
/// run only. Logs the key file's path and the stream id the key derives.
/// Blocks (file I/O).
pub fn load_or_create(dir: Option<&Path>) -> Result<WriterKey, KeyFileError> {
    let Some(dir) = dir else {
        let key = WriterKey::generate()?;
        tracing::info!(
            key = %key.public(),
            derived_stream = key.stream().get(),
            "no data directory: a writer key was generated for this run only"
        );
        return Ok(key);
    };
    let path = dir.join(WRITER_KEY_FILE);
    let (key, created) = match std::fs::File::open(&path) {
        Ok(file) => (WriterKey::from_bytes(read(&path, file)?), false),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let key = WriterKey::generate()?;
            write_new(&path, &key.to_bytes())?;
            (key, true)
        }
        Err(source) => {
            return Err(KeyFileError::Io {
                path,
                action: "read",
                source,
            })
        }
    };
    tracing::info!(
        path = %path.display(),
        key = %key.public(),
        derived_stream = key.stream().get(),
        created,
        "writer key {}", if created { "created" } else { "loaded" }
    );
    Ok(key)
}

/// The node's writer key in `dir`, which must exist (`meshlog key show`:
/// a command that looks must not make a node a new writer).
pub fn load(dir: &Path) -> Result<WriterKey, KeyFileError> {
    let path = dir.join(WRITER_KEY_FILE);
    Ok(WriterKey::from_bytes(read_file(&path)?))
}

/// A new mesh admin key, written to `path` (mode 0600, aside, synced,
/// renamed); an existing file is not replaced.
pub fn create_admin(path: &Path) -> Result<AdminKey, KeyFileError> {
    if path.exists() {
        return Err(KeyFileError::Exists {
            path: path.to_owned(),
        });
    }
    let key = AdminKey::generate()?;
    write_new(path, &key.to_bytes())?;
    Ok(key)
}

/// The mesh admin key in `path`, refused as a writer key is (others may
/// read it, or not of 32 bytes).
pub fn load_admin(path: &Path) -> Result<AdminKey, KeyFileError> {
    Ok(AdminKey::from_bytes(read_file(path)?))
}

fn read_file(path: &Path) -> Result<[u8; 32], KeyFileError> {
    let file = std::fs::File::open(path).map_err(|source| KeyFileError::Io {
        path: path.to_owned(),
        action: "read",
        source,
    })?;
    read(path, file)
}

/// The secret in an open key file, checked through the open file itself
/// (its mode and size), so what is checked is what is read.
fn read(path: &Path, mut file: std::fs::File) -> Result<[u8; 32], KeyFileError> {
    let io = |source| KeyFileError::Io {
        path: path.to_owned(),
        action: "read",
        source,
    };
    let metadata = file.metadata().map_err(io)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = metadata.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyFileError::Exposed {
                path: path.to_owned(),
                mode,
            });
        }
    }
    let wrong_size = |len| KeyFileError::WrongSize {
        path: path.to_owned(),
        len,
    };
    if metadata.len() != WriterKey::LEN as u64 {
        return Err(wrong_size(metadata.len()));
    }
    // One byte more than a key, so a file that grew since its size was
    // read is refused too, and nothing larger is read.
    let mut secret = Vec::with_capacity(WriterKey::LEN + 1);
    Read::by_ref(&mut file)
        .take(WriterKey::LEN as u64 + 1)
        .read_to_end(&mut secret)
        .map_err(io)?;
    let secret: [u8; 32] = secret
        .as_slice()
        .try_into()
        .map_err(|_| wrong_size(secret.len() as u64))?;
    Ok(secret)
}

/// A new key file at `path` with mode 0600 (aside, synced, renamed).
fn write_new(path: &Path, secret: &[u8; 32]) -> Result<(), KeyFileError> {
    let io = |source| KeyFileError::Io {
        path: path.to_owned(),
        action: "write",
        source,
    };
    let name = path.file_name().and_then(|name| name.to_str());
    let name = name.ok_or_else(|| io(std::io::ErrorKind::InvalidInput.into()))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    crate::durable_file::write_aside_and_rename(dir, name, secret, 0o600).map_err(io)
}
