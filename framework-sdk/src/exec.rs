//! `ringmaster-exec`: run one shell command as N tasks.
