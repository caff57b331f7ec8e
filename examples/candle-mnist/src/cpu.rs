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
