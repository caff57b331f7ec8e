//! The pipe on which a standby's process tells `fdl launch` that it took over: the launcher
//! keeps the read end, every rank process inherits the write end (named by
//! `FLODL_TAKEOVER_FD`) and writes `term N` once it is the controller of term N. The launcher
//! then takes the job's status from the standby's process however the old controller ended —
//! killed, stopped and never resumed, or resumed and ending on its own later — and starts a rank
//! it restarts after the takeover at the new controller.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;

use anyhow::{Context, Result};

/// The variable naming the descriptor the standby's process announces its takeover on.
pub(crate) const TAKEOVER_FD: &str = "FLODL_TAKEOVER_FD";

/// The lowest descriptor the write end is moved to in the launcher, above the ones a child
/// gets handed at fixed numbers (the controller's listener at 3).
const FIRST_FD: RawFd = 10;

/// Bytes of one notice at most: a longer line is not a notice and is dropped.
const LINE_CAP: usize = 64;

/// The launcher's end: the terms the standby's process has announced.
pub(crate) struct TermNotices {
    /// The read end, non-blocking.
    reader: std::io::PipeReader,
    /// Bytes of a line not yet complete.
    partial: Vec<u8>,
    /// The highest term announced.
    term: u64,
}

/// The write end every standby process inherits (the launcher keeps it for a restarted one).
pub(crate) struct NoticeWriter {
    fd: OwnedFd,
}

/// A new takeover pipe: its read end (non-blocking) and its write end.
///
/// # Errors
/// The pipe cannot be made or set up.
pub(crate) fn pipe() -> Result<(TermNotices, NoticeWriter)> {
    let (reader, writer) = std::io::pipe().context("cannot make the takeover pipe")?;
    let raw = reader.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function owns (the pipe's read end, open).
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    // SAFETY: as above; O_NONBLOCK only changes how reads wait.
    let set =
        flags >= 0 && unsafe { libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) } >= 0;
    if !set {
        return Err(std::io::Error::last_os_error()).context("cannot set up the takeover pipe");
    }
    // SAFETY: F_DUPFD_CLOEXEC returns a new descriptor (or -1), owned by nobody else.
    let moved = unsafe { libc::fcntl(writer.as_raw_fd(), libc::F_DUPFD_CLOEXEC, FIRST_FD) };
    if moved < 0 {
        return Err(std::io::Error::last_os_error()).context("cannot set up the takeover pipe");
    }
    // SAFETY: `moved` was just returned by fcntl, is open and owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(moved) };
    Ok((TermNotices { reader, partial: Vec::new(), term: 0 }, NoticeWriter { fd }))
}

impl NoticeWriter {
    /// Makes `cmd`'s process inherit the write end, named by [`TAKEOVER_FD`].
    pub(crate) fn hand(&self, cmd: &mut Command) {
        let fd = self.fd.as_raw_fd();
        cmd.env(TAKEOVER_FD, fd.to_string());
        // SAFETY: the closure runs in the child between fork and exec and calls only fcntl,
        // which is async-signal-safe; it allocates nothing and touches no lock. The descriptor
        // is at or above FIRST_FD, so no descriptor handed at a fixed number overwrites it.
        unsafe {
            cmd.pre_exec(move || {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

impl TermNotices {
    /// The highest term announced so far (0: none), reading what has arrived without waiting.
    pub(crate) fn poll(&mut self) -> u64 {
        let mut buf = [0u8; 256];
        loop {
            match self.reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => self.take(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.term
    }

    /// Folds `bytes` into the lines read so far.
    fn take(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b != b'\n' {
                if self.partial.len() < LINE_CAP {
                    self.partial.push(b);
                }
                continue;
            }
            if let Some(term) = parse(&self.partial) {
                self.term = self.term.max(term);
            }
            self.partial.clear();
        }
    }
}

/// The term of one notice line (`term N`), `None` for anything else.
fn parse(line: &[u8]) -> Option<u64> {
    std::str::from_utf8(line).ok()?.trim().strip_prefix("term ")?.trim().parse().ok()
}

/// Tells the launcher (when one handed a [`TAKEOVER_FD`]) that this process is now the
/// controller of `term`. A launcher that cannot be told is warned about and not waited for.
pub(crate) fn announce(term: u64) {
    let Ok(text) = std::env::var(TAKEOVER_FD) else { return };
    let Ok(fd) = text.trim().parse::<RawFd>() else {
        tracing::warn!("{TAKEOVER_FD}={text} is not a descriptor: the launcher is not told");
        return;
    };
    // SAFETY: fcntl(F_GETFD) only asks whether `fd` is open; it changes nothing.
    if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        tracing::warn!("{TAKEOVER_FD}={fd} is not open: the launcher is not told");
        return;
    }
    // SAFETY: `fd` is open (checked above) and stays open for this process's life: the launcher
    // handed it down and nothing in this process closes it. It is only borrowed for the dup
    // below; the copy is ours to close.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let written = borrowed
        .try_clone_to_owned()
        .map(std::fs::File::from)
        .and_then(|mut pipe| pipe.write_all(format!("term {term}\n").as_bytes()));
    if let Err(e) = written {
        tracing::warn!("cannot tell the launcher of the takeover: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Result = std::result::Result<(), Box<dyn std::error::Error>>;

    /// Notices split anywhere across reads, garbage, overlong lines and lower terms: the
    /// highest well-formed term wins.
    #[test]
    fn the_highest_announced_term_is_read_whole_lines_only() -> Result {
        let cases: [(&[&[u8]], u64); 6] = [
            (&[], 0),
            (&[b"term 1\n"], 1),
            (&[b"ter", b"m 2", b"\n"], 2),
            (&[b"term 3"], 0),
            (&[b"term 2\nterm 1\nnonsense\n"], 2),
            (&[&[b'x'; 200], b"term 9\n", b"term 4\n"], 4),
        ];
        for (chunks, want) in cases {
            let (mut notices, writer) = pipe()?;
            let mut pipe = std::fs::File::from(writer.fd.try_clone()?);
            for chunk in chunks {
                pipe.write_all(chunk)?;
                notices.poll();
            }
            assert_eq!(notices.poll(), want, "{chunks:?}");
        }
        Ok(())
    }
}
