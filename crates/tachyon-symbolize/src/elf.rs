//! The GNU build id of an ELF file, read with a few small bounded reads (the header, the
//! program or section headers, at most 64 KiB of notes), so that checking whether a path is the
//! binary a trace names costs little and cannot be made to read much, or to block: only
//! regular files are opened.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

const PT_NOTE: u32 = 4;
const SHT_NOTE: u32 = 7;
const NT_GNU_BUILD_ID: u32 = 3;
const MAX_NOTES: u64 = 64 << 10;
const MAX_HEADERS: usize = 4096;

/// The build id of the ELF file at `path`: `Ok(None)` for an ELF file without one; an error
/// for anything that is not a regular ELF file.
pub(crate) fn build_id_of(path: &Path) -> io::Result<Option<Vec<u8>>> {
    if !std::fs::metadata(path)?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut f = File::open(path)?;
    let mut ident = [0u8; 64];
    let n = read_up_to(&mut f, &mut ident)?;
    if n < 52 || &ident[..4] != b"\x7fELF" {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not an ELF file",
        ));
    }
    let wide = match ident[4] {
        1 => false,
        2 => true,
        _ => return Err(io::Error::new(io::ErrorKind::InvalidData, "bad ELF class")),
    };
    let big = match ident[5] {
        1 => false,
        2 => true,
        _ => return Err(io::Error::new(io::ErrorKind::InvalidData, "bad ELF data")),
    };
    let r = Reader { big };
    let h = &ident[..n];
    // (table offset, entry size, count) of the program and section headers.
    let (ph, sh) = if wide {
        (
            (r.u64(h, 32), r.u16(h, 54), r.u16(h, 56)),
            (r.u64(h, 40), r.u16(h, 58), r.u16(h, 60)),
        )
    } else {
        (
            (r.u32(h, 28).map(u64::from), r.u16(h, 42), r.u16(h, 44)),
            (r.u32(h, 32).map(u64::from), r.u16(h, 46), r.u16(h, 48)),
        )
    };
    // Notes in PT_NOTE segments, then in SHT_NOTE sections (separate debug files).
    for (table, is_segment) in [(ph, true), (sh, false)] {
        let (Some(off), Some(size), Some(count)) = table else {
            continue;
        };
        let (size, count) = (usize::from(size), usize::from(count).min(MAX_HEADERS));
        if off == 0 || count == 0 || size < if wide { 56 } else { 32 } {
            continue;
        }
        let mut table = vec![0u8; size * count];
        f.seek(SeekFrom::Start(off))?;
        let got = read_up_to(&mut f, &mut table)?;
        for e in table[..got].chunks_exact(size) {
            let (ty, offset, len) = match (is_segment, wide) {
                (true, true) => (r.u32(e, 0), r.u64(e, 8), r.u64(e, 32)),
                (true, false) => (
                    r.u32(e, 0),
                    r.u32(e, 4).map(u64::from),
                    r.u32(e, 16).map(u64::from),
                ),
                (false, true) => (r.u32(e, 4), r.u64(e, 24), r.u64(e, 32)),
                (false, false) => (
                    r.u32(e, 4),
                    r.u32(e, 16).map(u64::from),
                    r.u32(e, 20).map(u64::from),
                ),
            };
            let (Some(ty), Some(offset), Some(len)) = (ty, offset, len) else {
                continue;
            };
            if ty != if is_segment { PT_NOTE } else { SHT_NOTE } {
                continue;
            }
            let mut notes = vec![0u8; len.min(MAX_NOTES) as usize];
            f.seek(SeekFrom::Start(offset))?;
            let got = read_up_to(&mut f, &mut notes)?;
            if let Some(id) = gnu_build_id(&notes[..got], r) {
                return Ok(Some(id.to_vec()));
            }
        }
    }
    Ok(None)
}

/// Reads until `buf` is full or the file ends; the number of bytes read.
fn read_up_to(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[derive(Clone, Copy)]
struct Reader {
    big: bool,
}

impl Reader {
    fn u16(self, b: &[u8], o: usize) -> Option<u16> {
        let a: [u8; 2] = b.get(o..o + 2)?.try_into().ok()?;
        Some(if self.big {
            u16::from_be_bytes(a)
        } else {
            u16::from_le_bytes(a)
        })
    }
    fn u32(self, b: &[u8], o: usize) -> Option<u32> {
        let a: [u8; 4] = b.get(o..o + 4)?.try_into().ok()?;
        Some(if self.big {
            u32::from_be_bytes(a)
        } else {
            u32::from_le_bytes(a)
        })
    }
    fn u64(self, b: &[u8], o: usize) -> Option<u64> {
        let a: [u8; 8] = b.get(o..o + 8)?.try_into().ok()?;
        Some(if self.big {
            u64::from_be_bytes(a)
        } else {
            u64::from_le_bytes(a)
        })
    }
}

fn gnu_build_id(mut notes: &[u8], r: Reader) -> Option<&[u8]> {
    let align4 = |n: usize| n.checked_add(3).map(|n| n & !3);
    while notes.len() >= 12 {
        let namesz = r.u32(notes, 0)? as usize;
        let descsz = r.u32(notes, 4)? as usize;
        let ty = r.u32(notes, 8)?;
        let name_end = 12usize.checked_add(align4(namesz)?)?;
        let desc_end = name_end.checked_add(align4(descsz)?)?;
        if desc_end > notes.len() {
            return None;
        }
        if ty == NT_GNU_BUILD_ID && notes.get(12..12 + namesz) == Some(b"GNU\0") {
            return notes.get(name_end..name_end + descsz);
        }
        notes = &notes[desc_end..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_binary_has_a_build_id_and_garbage_is_refused() {
        let exe = std::env::current_exe().unwrap();
        let id = build_id_of(&exe).unwrap().expect("rustc links a build id");
        assert!(id.len() >= 8);
        assert!(build_id_of(Path::new("/dev/null")).is_err());
        assert!(build_id_of(Path::new("/")).is_err());
        let dir = std::env::temp_dir().join(format!("tachyon-elf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk");
        std::fs::write(&junk, b"\x7fELF\x02\x01garbage that stops short").unwrap();
        assert!(build_id_of(&junk).is_err());
        let mut hostile = std::fs::read(&exe).unwrap()[..64].to_vec();
        hostile[32..40].copy_from_slice(&u64::MAX.to_le_bytes()); // e_phoff far away
        std::fs::write(&junk, &hostile).unwrap();
        assert!(matches!(build_id_of(&junk), Ok(None) | Err(_)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
