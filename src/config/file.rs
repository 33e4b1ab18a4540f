//! Reading the config file and the files it names (keys, certificates, CAs, CRLs): only a
//! regular file is read (after following symlinks, which Kubernetes' Secret and ConfigMap
//! mounts are), and at most [`MAX_FILE_BYTES`] of it. Audit ME 2: a FIFO in a key file's
//! place had the reload watcher wait for a writer for good (every later reload and SIGHUP
//! with it, unsaid) and start-up hang past SIGTERM; `/dev/zero` as a `ca_file` was read
//! until memory ran out.

use std::fs::{FileType, Metadata, OpenOptions};
use std::io::{self, Read};
use std::path::Path;

/// The most bytes read of the config file or of a file it names: generous for every kind
/// (a CA bundle is about 200 KiB, a large CA's CRL a few MiB, 100,000 client keys about
/// 5 MiB), and a bound a file grown by mistake, or a device, cannot pass.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// Reads `path` whole: a regular file of at most [`MAX_FILE_BYTES`]. Anything else is an
/// error that says what it is (`a FIFO, not a regular file`, `larger than 16 MiB ...`),
/// and never a wait: the file's type is checked before it is opened, and again on what
/// was opened (a FIFO swapped in between is opened without waiting for a writer, on Linux).
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    read_as(path, false)
}

/// [`read`] as text, failing as `std::fs::read_to_string` does on bytes that are not UTF-8.
pub fn read_to_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read(path)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

/// Reads the config file at start-up or for `check`: as [`read`], but a pipe is taken too
/// (`--config <(envsubst < tmpl.toml)`), read once up to [`MAX_FILE_BYTES`]; its writer is
/// waited for, as `cat` would. A reload never reads a pipe ([`is_regular`]).
pub fn read_config(path: &Path) -> io::Result<Vec<u8>> {
    read_as(path, true)
}

/// Whether `path` is a regular file (after symlinks): what a reload may read again. A pipe
/// read at start-up is empty, or waits for a writer, when read again.
pub fn is_regular(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file())
}

/// Whether this machine can open `path`, without reading it or waiting (`check`'s "will not
/// start without it" warnings): the error of a file that is not there or may not be read.
/// What is there but is no regular file passes: [`read`] refuses it, saying what it is.
pub fn probe(path: &Path) -> io::Result<()> {
    let meta = std::fs::metadata(path)?;
    if meta.is_file() {
        open(path, false)?;
    }
    Ok(())
}

fn read_as(path: &Path, pipe_too: bool) -> io::Result<Vec<u8>> {
    let piped = pipe_too && is_fifo(&std::fs::metadata(path)?.file_type());
    let mut file = open(path, piped)?;
    let meta = file.metadata()?;
    if !piped {
        regular(&meta)?;
        if meta.len() > MAX_FILE_BYTES {
            return Err(too_large());
        }
    }
    let mut bytes = Vec::with_capacity(meta.len().min(MAX_FILE_BYTES) as usize);
    // One byte past the cap tells a file at the cap from one larger (or grown since).
    file.by_ref()
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}

/// Opens `path` to read: a regular file only, unless `pipe` (the config read once), checked
/// before the open, which on a FIFO would wait for a writer.
fn open(path: &Path, pipe: bool) -> io::Result<std::fs::File> {
    if !pipe {
        regular(&std::fs::metadata(path)?)?;
    }
    let mut options = OpenOptions::new();
    options.read(true);
    // A FIFO swapped in after the check is then opened at once, and refused by its type;
    // a regular file reads the same either way.
    #[cfg(target_os = "linux")]
    if !pipe {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path)
}

/// An error unless `meta` is a regular file's, saying what it is instead.
fn regular(meta: &Metadata) -> io::Result<()> {
    if meta.is_file() {
        return Ok(());
    }
    let what = kind(&meta.file_type());
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{what}, not a regular file"),
    ))
}

fn too_large() -> io::Error {
    io::Error::new(
        io::ErrorKind::FileTooLarge,
        format!(
            "larger than 16 MiB ({MAX_FILE_BYTES} bytes), the most Hourglass reads of its \
             config or of a file it names"
        ),
    )
}

fn kind(t: &FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "something else"
    }
}

fn is_fifo(t: &FileType) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        t.is_fifo()
    }
    #[cfg(not(unix))]
    {
        let _ = t;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkfifo(path: &Path) {
        let made = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .unwrap();
        assert!(made.success());
    }

    /// Audit ME 2: a FIFO, a device, a directory are refused, saying what each is, and
    /// without a wait; a symlink to a regular file (a Kubernetes mount) reads.
    #[test]
    fn only_a_regular_file_is_read_and_a_fifo_never_waits() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        mkfifo(&fifo);
        for (path, what) in [
            (fifo.as_path(), "a FIFO, not a regular file"),
            (
                Path::new("/dev/zero"),
                "a character device, not a regular file",
            ),
            (dir.path(), "a directory, not a regular file"),
        ] {
            let e = read(path).unwrap_err();
            assert_eq!(e.to_string(), what, "{}", path.display());
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            // Present: `check` leaves it to the read to say what it is.
            probe(path).unwrap();
            assert!(!is_regular(path));
        }
        let key = dir.path().join("key");
        std::fs::write(&key, "sk-0123456789\n").unwrap();
        let link = dir.path().join("..data-key");
        std::os::unix::fs::symlink(&key, &link).unwrap();
        assert_eq!(read(&link).unwrap(), b"sk-0123456789\n");
        assert_eq!(read_to_string(&link).unwrap(), "sk-0123456789\n");
        assert!(is_regular(&link));
        assert_eq!(
            probe(&dir.path().join("absent")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    /// Audit ME 2: a file over the cap is refused, saying so; one at the cap reads.
    #[test]
    fn a_file_over_16_mib_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("large");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(MAX_FILE_BYTES).unwrap();
        assert_eq!(read(&path).unwrap().len() as u64, MAX_FILE_BYTES);
        file.set_len(MAX_FILE_BYTES + 1).unwrap();
        let e = read(&path).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        assert!(e.to_string().starts_with("larger than 16 MiB"), "{e}");
        // There, and readable: `check` leaves it to the read to refuse.
        probe(&path).unwrap();
    }

    /// Audit ME 4: the config may come from a pipe, read once; a file the config names may
    /// not.
    #[test]
    fn the_config_may_be_a_pipe() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("config");
        mkfifo(&fifo);
        let writer = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::write(fifo, "[upstreams.a]\n").unwrap())
        };
        assert_eq!(read_config(&fifo).unwrap(), b"[upstreams.a]\n");
        writer.join().unwrap();
        assert!(read(&fifo).is_err());
        assert!(read_config(Path::new("/dev/zero")).is_err());
    }
}
