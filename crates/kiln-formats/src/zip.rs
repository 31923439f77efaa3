//! The members of a zip archive whose members are stored (not compressed), as `.npz` archives
//! and PyTorch checkpoints are: located through the central directory (so members written with
//! data descriptors, whose local headers carry no sizes, are found), ZIP64 included.

use std::path::Path;

use crate::FormatError;

/// One member: its name and where its bytes lie in the archive.
#[derive(Debug, Clone)]
pub struct ZipMember {
    pub name: String,
    /// Compression method (0 = stored).
    pub method: u16,
    pub start: usize,
    pub len: usize,
}

impl ZipMember {
    /// The member's bytes (its range was checked against the archive when it was listed).
    pub fn data<'a>(&self, archive: &'a [u8]) -> &'a [u8] {
        &archive[self.start..self.start + self.len]
    }
}

fn invalid(path: &Path, what: String) -> FormatError {
    FormatError::Invalid {
        path: path.to_path_buf(),
        what,
    }
}

fn u16_at(b: &[u8], p: usize) -> Option<u64> {
    Some(u16::from_le_bytes(b.get(p..p.checked_add(2)?)?.try_into().ok()?) as u64)
}

fn u32_at(b: &[u8], p: usize) -> Option<u64> {
    Some(u32::from_le_bytes(b.get(p..p.checked_add(4)?)?.try_into().ok()?) as u64)
}

fn u64_at(b: &[u8], p: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(p..p.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// Every member of the archive `b` in central-directory order; `path` names it in errors.
/// Each member's range is checked to lie inside `b`.
pub fn members(path: &Path, b: &[u8]) -> Result<Vec<ZipMember>, FormatError> {
    let bad = |what: String| invalid(path, what);
    // End of central directory: 22 bytes plus a comment of up to 64 KiB, at the end.
    let tail = b.len().saturating_sub(22 + 0xffff);
    let eocd = (tail..b.len().saturating_sub(21))
        .rev()
        .find(|&i| b[i..i + 4] == *b"PK\x05\x06")
        .ok_or_else(|| bad("not a zip archive (no end of central directory)".into()))?;
    let trunc = |what: &str| bad(format!("zip {what} is truncated"));
    let mut count = u16_at(b, eocd + 10).ok_or_else(|| trunc("directory end"))?;
    let mut cd_len = u32_at(b, eocd + 12).ok_or_else(|| trunc("directory end"))?;
    let mut cd_at = u32_at(b, eocd + 16).ok_or_else(|| trunc("directory end"))?;
    if count == 0xffff || cd_len == 0xffff_ffff || cd_at == 0xffff_ffff {
        // ZIP64: a locator just before points at the ZIP64 end of central directory record.
        let loc = eocd
            .checked_sub(20)
            .filter(|&l| b.get(l..l + 4) == Some(b"PK\x06\x07"))
            .ok_or_else(|| bad("ZIP64 archive without a ZIP64 locator".into()))?;
        let rec = u64_at(b, loc + 8).ok_or_else(|| trunc("ZIP64 locator"))? as usize;
        if b.get(rec..rec.saturating_add(4)) != Some(b"PK\x06\x06") {
            return Err(bad(format!("no ZIP64 directory end at byte {rec}")));
        }
        let f = |o: usize| u64_at(b, rec + o).ok_or_else(|| trunc("ZIP64 directory end"));
        (count, cd_len, cd_at) = (f(32)?, f(40)?, f(48)?);
    }
    let cd_end = cd_at
        .checked_add(cd_len)
        .filter(|&e| e <= b.len() as u64)
        .ok_or_else(|| {
            bad(format!(
                "central directory ({cd_len} bytes at {cd_at}) runs past the end ({} bytes)",
                b.len()
            ))
        })? as usize;
    // Each entry is at least 46 bytes: a count the directory cannot hold is a lie.
    if count > cd_len / 46 {
        return Err(bad(format!(
            "{count} members do not fit a {cd_len}-byte directory"
        )));
    }
    let mut out = Vec::with_capacity(count as usize);
    let mut p = cd_at as usize;
    for i in 0..count {
        if b.get(p..p + 4) != Some(b"PK\x01\x02") || p + 46 > cd_end {
            return Err(bad(format!("directory entry {i} at byte {p} is malformed")));
        }
        let e = |o: usize| u32_at(b, p + o).unwrap_or(0);
        let h = |o: usize| u16_at(b, p + o).unwrap_or(0) as usize;
        let (method, mut csize, mut usize_, mut local) = (h(10) as u16, e(20), e(24), e(42));
        let (nlen, xlen, clen) = (h(28), h(30), h(32));
        let name_end = p + 46 + nlen;
        let next = name_end + xlen + clen;
        if next > cd_end {
            return Err(bad(format!(
                "directory entry {i} at byte {p} runs past the directory"
            )));
        }
        let name = String::from_utf8_lossy(&b[p + 46..name_end]).into_owned();
        // ZIP64 extra field (id 1): the 64-bit values of the fields that read 0xffffffff, in
        // the order uncompressed size, compressed size, local header offset.
        let extra = &b[name_end..name_end + xlen];
        let mut x = 0;
        while x + 4 <= extra.len() {
            let id = u16_at(extra, x).unwrap_or(0);
            let sz = u16_at(extra, x + 2).unwrap_or(0) as usize;
            if id == 1 {
                let mut q = x + 4;
                for v in [&mut usize_, &mut csize, &mut local] {
                    if *v == 0xffff_ffff {
                        *v = u64_at(extra, q)
                            .filter(|_| q + 8 <= x + 4 + sz)
                            .ok_or_else(|| bad(format!("member '{name}': short ZIP64 field")))?;
                        q += 8;
                    }
                }
            }
            x += 4 + sz;
        }
        if method == 0 && csize != usize_ {
            return Err(bad(format!(
                "member '{name}' is stored but its sizes differ ({csize} and {usize_})"
            )));
        }
        // The local header repeats the name and has its own extra field (alignment padding).
        let l = local as usize;
        if local >= b.len() as u64 || b.get(l..l + 4) != Some(b"PK\x03\x04") {
            return Err(bad(format!(
                "member '{name}': no local header at byte {local}"
            )));
        }
        let lh = |o: usize| u16_at(b, l + o).map(|v| v as usize);
        let (ln, lx) = lh(26)
            .zip(lh(28))
            .ok_or_else(|| bad(format!("member '{name}': local header is truncated")))?;
        let start = l + 30 + ln + lx;
        let end = (start as u64)
            .checked_add(csize)
            .filter(|&e| e <= b.len() as u64);
        let Some(end) = end else {
            return Err(bad(format!(
                "member '{name}' ({csize} bytes at {start}) runs past the end ({} bytes)",
                b.len()
            )));
        };
        out.push(ZipMember {
            name,
            method,
            start,
            len: end as usize - start,
        });
        p = next;
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A stored archive written field by field; `descriptor` writes sizes only in the
    /// central directory and a data descriptor (as PyTorch's writer does).
    pub(crate) fn archive(files: &[(&str, &[u8])], descriptor: bool) -> Vec<u8> {
        let mut b = Vec::new();
        let mut cd = Vec::new();
        for (name, data) in files {
            let at = b.len() as u32;
            let size = data.len() as u32;
            let (flags, local_size) = if descriptor { (8u16, 0) } else { (0, size) };
            b.extend(b"PK\x03\x04\x14\x00");
            b.extend(flags.to_le_bytes());
            b.extend([0u8; 6]);
            b.extend(0u32.to_le_bytes()); // crc (not checked)
            b.extend(local_size.to_le_bytes());
            b.extend(local_size.to_le_bytes());
            b.extend((name.len() as u16).to_le_bytes());
            b.extend(3u16.to_le_bytes());
            b.extend(name.as_bytes());
            b.extend([0u8; 3]);
            b.extend(*data);
            if descriptor {
                b.extend(b"PK\x07\x08");
                b.extend([0u8; 4]);
                b.extend(size.to_le_bytes());
                b.extend(size.to_le_bytes());
            }
            cd.extend(b"PK\x01\x02\x14\x00\x14\x00");
            cd.extend(flags.to_le_bytes());
            cd.extend([0u8; 10]);
            cd.extend(size.to_le_bytes());
            cd.extend(size.to_le_bytes());
            cd.extend((name.len() as u16).to_le_bytes());
            cd.extend([0u8; 12]);
            cd.extend(at.to_le_bytes());
            cd.extend(name.as_bytes());
        }
        let cd_at = b.len() as u32;
        b.extend(&cd);
        b.extend(b"PK\x05\x06\x00\x00\x00\x00");
        b.extend((files.len() as u16).to_le_bytes());
        b.extend((files.len() as u16).to_le_bytes());
        b.extend((cd.len() as u32).to_le_bytes());
        b.extend(cd_at.to_le_bytes());
        b.extend([0u8; 2]);
        b
    }

    #[test]
    fn finds_members_with_and_without_descriptors() {
        for descriptor in [false, true] {
            let a = archive(&[("x/a", b"hello"), ("x/b", b"")], descriptor);
            let m = members(Path::new("t.zip"), &a).unwrap();
            assert_eq!(m.len(), 2);
            assert_eq!(m[0].name, "x/a");
            assert_eq!(m[0].data(&a), b"hello");
            assert_eq!(m[1].data(&a), b"");
        }
    }

    #[test]
    fn truncations_are_errors() {
        let a = archive(&[("x/a", b"hello world")], true);
        for n in 0..a.len() {
            assert!(members(Path::new("t.zip"), &a[..n]).is_err(), "{n}");
        }
    }
}
