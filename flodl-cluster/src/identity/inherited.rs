//! The controller's listening socket, bound by its launcher and handed down to its process.

use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};

use super::error::IdentityError;

/// The variable naming the file descriptor of a listening TCP socket that `fdl launch` bound for
/// the controller and left open in the controller's process (so nobody can take the port between
/// the launcher's choice and the controller's use).
pub const CONTROLLER_FD: &str = "FLODL_CONTROLLER_FD";

/// Whether this process has already taken the inherited socket.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// The listening socket named by [`CONTROLLER_FD`], taken once per process (later calls, and
/// processes without the variable, get `None`).
///
/// # Errors
/// [`IdentityError::ListenerFd`] when the variable is not a descriptor number above 2, or the
/// descriptor is not a bound socket.
pub fn inherited_listener() -> Result<Option<TcpListener>, IdentityError> {
    let Some(value) = std::env::var_os(CONTROLLER_FD) else { return Ok(None) };
    if TAKEN.swap(true, Ordering::AcqRel) {
        return Ok(None);
    }
    let value = value.to_string_lossy().into_owned();
    let fail = |reason: String| IdentityError::ListenerFd {
        var: CONTROLLER_FD,
        value: value.clone(),
        reason,
    };
    let fd: i32 = value.trim().parse().map_err(|_| fail("not a descriptor number".into()))?;
    if fd <= 2 {
        return Err(fail("descriptors 0 to 2 are the standard streams".into()));
    }
    #[cfg(unix)]
    {
        use std::os::fd::FromRawFd;
        // SAFETY: the launcher that set the variable left `fd` open in this process for the
        // controller alone; `TAKEN` makes this the only place that takes ownership of it, once.
        let listener = unsafe { TcpListener::from_raw_fd(fd) };
        listener.local_addr().map_err(|e| fail(format!("not a bound socket: {e}")))?;
        Ok(Some(listener))
    }
    #[cfg(not(unix))]
    {
        Err(fail("handing a socket down is supported on Unix only".into()))
    }
}
