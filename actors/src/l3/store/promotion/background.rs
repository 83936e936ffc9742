//! Background CPU priority for promotion workers. A promotion is best-effort work for
//! later reads: it must not take the cores from the request it follows (the GET that
//! read into Host, the round, the copies to the Device). Its workers therefore run at the
//! lowest ordinary priority (nice 19, per thread on Linux): they still run whenever a core
//! is free, so every promotion makes progress, but a foreground thread that wants a core
//! gets it first. It changes nothing but the calling thread's scheduling priority.

/// The nice value promotion workers run at.
pub const BACKGROUND_NICE: i32 = 19;

/// Lowers the calling thread's priority to `BACKGROUND_NICE`.
#[cfg(target_os = "linux")]
pub fn lower_current_thread() -> std::io::Result<()> {
    // SAFETY: gettid and setpriority take and return plain integers (no pointer, no
    // memory the call could touch); PRIO_PROCESS with a thread id changes that thread
    // alone on Linux. `the_calling_thread_alone_runs_at_the_background_nice` checks it.
    let r = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, BACKGROUND_NICE)
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Elsewhere the workers keep the ordinary priority.
#[cfg(not(target_os = "linux"))]
pub fn lower_current_thread() -> std::io::Result<()> {
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The nice value of the calling thread, from /proc (field 19 of its stat line).
    fn nice_of_this_thread() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        let after_comm = &stat[stat.rfind(')').unwrap() + 2..];
        after_comm.split(' ').nth(16).unwrap().parse().unwrap()
    }

    #[test]
    fn the_calling_thread_alone_runs_at_the_background_nice() {
        let before = nice_of_this_thread();
        let inside = std::thread::spawn(|| {
            lower_current_thread().unwrap();
            nice_of_this_thread()
        })
        .join()
        .unwrap();
        assert_eq!(inside, BACKGROUND_NICE);
        assert_eq!(
            nice_of_this_thread(),
            before,
            "other threads keep their priority"
        );
    }
}
