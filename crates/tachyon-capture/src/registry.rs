//! Local discovery: each program that accepts captures writes one small file about itself
//! into a per-user runtime directory and removes it when it stops listening; `tachyon capture
//! --list`, `--pid` and `--name` read them.
//!
//! The directory is `$XDG_RUNTIME_DIR/tachyon` when that variable names an absolute path,
//! else `/tmp/tachyon-<uid>`. It is created with mode 0700 and used only when it is a real
//! directory (not a symlink) owned by this user that no one else can write: another user must
//! not be able to plant entries pointing captures elsewhere. An entry is `<pid>.capture`, lines
//! of `key=value` (`pid`, `name`, `addr`, `port`, `version`); entries whose pid is not alive
//! are ignored (and removed when possible), as are malformed or oversized ones.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Largest entry file read.
const MAX_ENTRY: u64 = 4096;

/// One program accepting captures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its pid.
    pub pid: u32,
    /// Its name.
    pub name: String,
    /// The address it listens on.
    pub addr: String,
    /// The port.
    pub port: u16,
    /// The protocol version it speaks.
    pub version: u32,
}

impl Entry {
    fn to_text(&self) -> String {
        let name: String = self.name.chars().filter(|c| !c.is_control()).collect();
        format!(
            "pid={}\nname={}\naddr={}\nport={}\nversion={}\n",
            self.pid, name, self.addr, self.port, self.version
        )
    }

    fn parse(text: &str) -> Option<Entry> {
        let mut pid = None;
        let mut name = None;
        let mut addr = None;
        let mut port = None;
        let mut version = None;
        for line in text.lines() {
            let (k, v) = line.split_once('=')?;
            match k {
                "pid" => pid = v.parse().ok(),
                "name" => name = Some(v.to_owned()),
                "addr" => addr = Some(v.to_owned()),
                "port" => port = v.parse().ok(),
                "version" => version = v.parse().ok(),
                _ => {}
            }
        }
        Some(Entry {
            pid: pid?,
            name: name?,
            addr: addr?,
            port: port?,
            version: version?,
        })
    }
}

/// The registry directory for this user (not created).
pub fn default_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(p) if p.is_absolute() => p.join("tachyon"),
        _ => PathBuf::from(format!("/tmp/tachyon-{}", current_uid())),
    }
}

fn current_uid() -> u32 {
    // The owner of /proc/self is this process's real uid; no libc call needed.
    fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX)
}

/// Creates `dir` (mode 0700) if needed and checks it is private: a directory, not a symlink,
/// owned by this user, not writable or readable by others.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    check_private(dir)
}

fn check_private(dir: &Path) -> io::Result<()> {
    let m = fs::symlink_metadata(dir)?;
    let refuse = |why: &str| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("the capture registry {} {why}; not used", dir.display()),
        ))
    };
    if !m.is_dir() {
        return refuse("is not a directory");
    }
    if m.uid() != current_uid() {
        return refuse("belongs to another user");
    }
    if m.permissions().mode() & 0o077 != 0 {
        return refuse("is accessible to other users (expected mode 0700)");
    }
    Ok(())
}

fn pid_alive(pid: u32) -> bool {
    pid != 0 && Path::new(&format!("/proc/{pid}")).exists()
}

/// A registration: removes its entry when dropped.
#[derive(Debug)]
pub struct Registration {
    path: PathBuf,
}

impl Registration {
    /// The entry file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Registers `entry` in `dir` (created private if needed). The file is written whole and
/// renamed into place, so readers never see half an entry.
pub fn register(dir: &Path, entry: &Entry) -> io::Result<Registration> {
    ensure_private_dir(dir)?;
    let path = dir.join(format!("{}.capture", entry.pid));
    let tmp = dir.join(format!(".{}.capture.tmp", entry.pid));
    {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(entry.to_text().as_bytes())?;
    }
    fs::rename(&tmp, &path)?;
    Ok(Registration { path })
}

trait OpenMode {
    fn mode(&mut self, mode: u32) -> &mut Self;
}

impl OpenMode for fs::OpenOptions {
    fn mode(&mut self, mode: u32) -> &mut Self {
        std::os::unix::fs::OpenOptionsExt::mode(self, mode)
    }
}

/// The live programs registered in `dir`, by pid. A missing or non-private directory lists
/// nothing; stale entries (dead pids) are skipped and removed.
pub fn list(dir: &Path) -> Vec<Entry> {
    if check_private(dir).is_err() {
        return Vec::new();
    }
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let path = e.path();
        if path.extension().and_then(|x| x.to_str()) != Some("capture") {
            continue;
        }
        let Ok(m) = fs::symlink_metadata(&path) else {
            continue;
        };
        if !m.is_file() || m.len() > MAX_ENTRY {
            continue;
        }
        let Some(entry) = fs::read_to_string(&path)
            .ok()
            .and_then(|t| Entry::parse(&t))
        else {
            continue;
        };
        if !pid_alive(entry.pid) {
            let _ = fs::remove_file(&path);
            continue;
        }
        out.push(entry);
    }
    out.sort_by_key(|e| e.pid);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("tachyon-registry-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn entries_register_list_and_unregister() {
        let dir = tmp("basic");
        let me = Entry {
            pid: std::process::id(),
            name: "test\nprogram".into(),
            addr: "127.0.0.1".into(),
            port: 4321,
            version: 1,
        };
        let reg = register(&dir, &me).unwrap();
        let listed = list(&dir);
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].port, 4321);
        assert_eq!(listed[0].name, "testprogram");
        // A dead pid is ignored and removed; garbage is ignored.
        let dead = Entry {
            pid: u32::MAX - 1,
            ..me.clone()
        };
        std::mem::forget(register(&dir, &dead).unwrap());
        fs::write(dir.join("7.capture"), "garbage").unwrap();
        assert_eq!(list(&dir).len(), 1);
        assert!(!dir.join(format!("{}.capture", u32::MAX - 1)).exists());
        drop(reg);
        assert!(list(&dir).is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_shared_directory_is_refused() {
        let dir = tmp("shared");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(ensure_private_dir(&dir).is_err());
        assert!(list(&dir).is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }
}
