//! The end-to-end benchmarks that drive real engine-host processes over loopback HTTP:
//! `bench ttft` (TTFT cohorts against recomputation) and `bench replay` (public KV-cache
//! traces through several engine hosts sharing one L3). Each writes a JSON file and an SVG
//! plot. They measure; they never assert a timing (CI runs them for correctness only).
//! `commands` holds every `bench` subcommand's flags and run (the binary dispatches to it).

pub mod commands;
pub mod http;
pub mod idle;
pub mod memory;
pub mod plot;
pub mod process;
pub mod raw_transfer;
pub mod replay;
pub mod stats;
pub mod trace;
pub mod ttft;

/// A benchmark's scratch directory: `<dir>/<name>-<pid>`, created with every missing
/// ancestor, and removed on drop together with the ancestors it created (only while they
/// are empty, so a directory that held anything else stays).
pub struct ScratchDir {
    path: std::path::PathBuf,
    created: Vec<std::path::PathBuf>,
}

impl ScratchDir {
    pub fn create(dir: &str, name: &str) -> Result<Self, String> {
        let path = std::path::Path::new(dir).join(format!("{name}-{}", std::process::id()));
        let mut created = vec![];
        let mut p = Some(path.as_path());
        while let Some(d) = p {
            if d.as_os_str().is_empty() || d.exists() {
                break;
            }
            created.push(d.to_path_buf());
            p = d.parent();
        }
        std::fs::create_dir_all(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self { path, created })
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
        // Innermost first; remove_dir refuses a directory that is not empty.
        for d in self.created.iter().skip(1) {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ScratchDir;

    #[test]
    fn scratch_dir_removes_what_it_created_and_nothing_else() {
        let root = tempfile::tempdir().unwrap();
        let keep = root.path().join("keep");
        std::fs::create_dir_all(&keep).unwrap();
        let dir = keep.join("a/b");
        let s = ScratchDir::create(dir.to_str().unwrap(), "x").unwrap();
        assert!(s.path().is_dir());
        std::fs::write(s.path().join("f"), b"1").unwrap();
        drop(s);
        assert!(!keep.join("a").exists(), "the created ancestors are gone");
        assert!(keep.is_dir(), "an existing directory stays");

        let s = ScratchDir::create(keep.to_str().unwrap(), "y").unwrap();
        std::fs::write(keep.join("other"), b"1").unwrap();
        drop(s);
        assert!(keep.join("other").is_file());
        assert_eq!(std::fs::read_dir(&keep).unwrap().count(), 1);
    }
}
