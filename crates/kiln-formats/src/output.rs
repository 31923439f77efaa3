//! Output files written in full or not at all: the bytes go to a temporary file beside the
//! destination, which takes the destination's name only once everything is written. A run
//! that fails (a bad argument found late, a full disk, an interrupt) leaves a file that was
//! already there as it was, and no partial one.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A file being written to `path`; [`OutputFile::commit`] puts it there. Dropped without a
/// commit, it is removed and `path` is untouched.
pub struct OutputFile {
    tmp: tempfile::NamedTempFile,
    path: PathBuf,
}

impl OutputFile {
    /// Starts writing `path`: a temporary file in the same directory (so the final rename
    /// stays on one file system), created with the permissions a new file would get.
    pub fn create(path: impl AsRef<Path>) -> std::io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = path
            .file_name()
            .map_or("out".into(), |n| n.to_string_lossy());
        let mut b = tempfile::Builder::new();
        let prefix = format!(".{name}.");
        b.prefix(&prefix).suffix(".partial");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            // The process's umask applies, as it does to `File::create`.
            b.permissions(std::fs::Permissions::from_mode(0o666));
        }
        let tmp = b.tempfile_in(&dir).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("creating {} (in {}): {e}", path.display(), dir.display()),
            )
        })?;
        Ok(OutputFile { tmp, path })
    }

    /// The file being written.
    pub fn file(&mut self) -> &mut File {
        self.tmp.as_file_mut()
    }

    /// Where the file goes on commit.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Flushes the file and moves it to its path, replacing what was there.
    pub fn commit(mut self) -> std::io::Result<()> {
        self.tmp.as_file_mut().flush()?;
        let path = self.path;
        self.tmp.persist(&path).map(drop).map_err(|e| {
            std::io::Error::new(
                e.error.kind(),
                format!("writing {}: {}", path.display(), e.error),
            )
        })
    }
}

/// Writes `bytes` to `path` in full or not at all.
pub fn write(path: impl AsRef<Path>, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = OutputFile::create(path)?;
    f.file().write_all(bytes)?;
    f.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file already at the path survives an output that is dropped unfinished; a commit
    /// replaces it; no temporary file is left either way.
    #[test]
    fn only_a_commit_replaces_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.wav");
        std::fs::write(&p, b"keep me").unwrap();
        {
            let mut f = OutputFile::create(&p).unwrap();
            f.file().write_all(b"half").unwrap();
        }
        assert_eq!(std::fs::read(&p).unwrap(), b"keep me");
        let mut f = OutputFile::create(&p).unwrap();
        f.file().write_all(b"new").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        write(&p, b"again").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"again");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("x.wav")]);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let plain = dir.path().join("plain");
            std::fs::File::create(&plain).unwrap();
            let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode();
            assert_eq!(mode(&p), mode(&plain), "the permissions a new file gets");
            std::fs::remove_file(&plain).unwrap();
        }
        let e = OutputFile::create(dir.path().join("no/such/dir/y.wav"))
            .err()
            .unwrap();
        assert!(e.to_string().contains("y.wav"), "{e}");
    }
}
