//! Where the daemon's sockets live.
//!
//! `TACHYON_PRODUCER_SOCK` and `TACHYON_CONSUMER_SOCK` name them outright. Otherwise both live
//! in the user's runtime directory (`$XDG_RUNTIME_DIR`, private to the user by the XDG spec),
//! or failing that in `/tmp/tachyon-<uid>`, a directory the daemon creates with mode 0700 and
//! refuses to use when someone else owns it or it is open to others.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Names the producer socket.
pub const PRODUCER_SOCK_ENV: &str = "TACHYON_PRODUCER_SOCK";
/// Names the consumer socket.
pub const CONSUMER_SOCK_ENV: &str = "TACHYON_CONSUMER_SOCK";
/// File name of the producer socket in the default directory.
pub const PRODUCER_SOCK_NAME: &str = "tachyon-producer.sock";
/// File name of the consumer socket in the default directory.
pub const CONSUMER_SOCK_NAME: &str = "tachyon-consumer.sock";

/// The directory default sockets live in (not created here).
pub fn default_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() && Path::new(&d).is_dir() => PathBuf::from(d),
        _ => PathBuf::from(format!(
            "/tmp/tachyon-{}",
            rustix::process::getuid().as_raw()
        )),
    }
}

/// The producer socket: `TACHYON_PRODUCER_SOCK`, else the default.
pub fn producer_socket() -> PathBuf {
    from_env(PRODUCER_SOCK_ENV).unwrap_or_else(|| default_dir().join(PRODUCER_SOCK_NAME))
}

/// The consumer socket: `TACHYON_CONSUMER_SOCK`, else the default.
pub fn consumer_socket() -> PathBuf {
    from_env(CONSUMER_SOCK_ENV).unwrap_or_else(|| default_dir().join(CONSUMER_SOCK_NAME))
}

fn from_env(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Makes sure `dir` exists as a directory private to this user (creating it with mode 0700).
/// An error when it exists but belongs to someone else or is writable by others: a socket
/// placed there could be swapped by them.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    let uid = rustix::process::getuid().as_raw();
    if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a directory owned by uid {uid} and closed to others",
                dir.display()
            ),
        ));
    }
    Ok(())
}

/// Binds a listening socket at `path` with file mode `mode` (e.g. 0o666 for the producer socket,
/// which any local process may use; 0o600 for the consumer socket). A stale socket file left by
/// a dead daemon is replaced; a live one is an [`io::ErrorKind::AddrInUse`] error.
pub fn bind_listener(path: &Path, mode: u32) -> io::Result<std::os::unix::net::UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("a daemon already listens on {}", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listener_gets_its_mode_and_replaces_a_stale_socket() {
        let dir = std::env::temp_dir().join(format!("tachyon-ipc-test-{}", std::process::id()));
        ensure_private_dir(&dir).unwrap();
        let path = dir.join("c.sock");
        let l = bind_listener(&path, 0o600).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let e = bind_listener(&path, 0o600).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
        drop(l);
        let _l = bind_listener(&path, 0o666).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn directories_open_to_others_are_refused() {
        let dir = std::env::temp_dir().join(format!("tachyon-ipc-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(ensure_private_dir(&dir).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
