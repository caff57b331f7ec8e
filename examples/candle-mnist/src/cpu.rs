//! The process's CPU time, a measure of work that the machine's other load hardly changes.

/// Linux's fixed unit of the CPU times in `/proc/<pid>/stat` (`USER_HZ`), per second.
const TICKS_PER_S: f64 = 100.0;

/// CPU seconds (user and system, all threads, finished ones included) the process has used
/// so far; `None` where Linux's `/proc/self/stat` cannot be read.
pub fn process_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name (in parentheses, which may hold spaces): the third
    // field of the line is the first here; utime and stime are the 14th and 15th.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = rest.split_whitespace().skip(11);
    let user: f64 = fields.next()?.parse().ok()?;
    let system: f64 = fields.next()?.parse().ok()?;
    Some((user + system) / TICKS_PER_S)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    /// On Linux the process's CPU time reads, and grows with work done: two clock ticks of
    /// arithmetic show within ten seconds, however loaded the machine.
    #[test]
    fn grows_with_work() -> Result<(), String> {
        if !cfg!(target_os = "linux") {
            return Ok(());
        }
        let before = super::process_seconds().ok_or("no CPU time before")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut x = 0u64;
        loop {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
            let now = super::process_seconds().ok_or("no CPU time after")?;
            if now - before >= 0.02 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{before} s, then {now} s after ten seconds of work"));
            }
        }
    }
}
