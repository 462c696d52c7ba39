//! What this machine has: cpus, memory, disk and hostname, for flags the user leaves out.
//!
//! Detection never fails: a dimension that cannot be measured is left out (and logged), so an
//! agent on an unusual system still starts and the user can state the amount explicitly.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;

use ringmaster_proto::devices::{Device, DeviceError, DeviceState};
use ringmaster_proto::resources::{Resources, MILLI};

const MIB: u64 = 1024 * 1024;

/// Detects `cpus` (available parallelism), `mem` (MemTotal of /proc/meminfo, MiB) and `disk`
/// (space available to unprivileged users on the work dir's filesystem, MiB; the nearest
/// existing ancestor is measured when the work dir does not exist yet).
pub fn detect_resources(work_dir: &Path) -> Resources {
    let mut resources = Resources::new();
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get() as u64)
        .unwrap_or(1);
    resources.set_milli("cpus", cpus * MILLI);
    match memory_mib() {
        Some(mem) => resources.set_milli("mem", mem.saturating_mul(MILLI)),
        None => tracing::warn!("cannot read MemTotal from /proc/meminfo; no mem detected"),
    }
    match disk_free_mib(work_dir) {
        Some(disk) => resources.set_milli("disk", disk.saturating_mul(MILLI)),
        None => tracing::warn!(
            "cannot measure free disk under {}; no disk detected",
            work_dir.display()
        ),
    }
    resources
}

/// NVIDIA GPUs, by `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader`.
/// None when nvidia-smi is absent, fails, or prints what cannot be parsed (logged).
pub fn detect_gpus() -> Vec<Device> {
    let output = match std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=index,name,memory.total",
            "--format=csv,noheader",
        ])
        .stdin(std::process::Stdio::null())
        .output()
    {
        Ok(output) => output,
        Err(e) => {
            tracing::debug!("no nvidia-smi ({e}); no GPUs detected");
            return Vec::new();
        }
    };
    if !output.status.success() {
        tracing::warn!(status = %output.status, "nvidia-smi failed; no GPUs detected");
        return Vec::new();
    }
    match parse_nvidia_smi(&String::from_utf8_lossy(&output.stdout)) {
        Ok(devices) => devices,
        Err(e) => {
            tracing::warn!("cannot read nvidia-smi output ({e}); no GPUs detected");
            Vec::new()
        }
    }
}

/// This machine's hostname, or `localhost` when it cannot be read.
pub fn detect_hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for `buf.len()` bytes; gethostname writes at most that many.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        let name = String::from_utf8_lossy(&buf[..end]).trim().to_string();
        if !name.is_empty() {
            return name;
        }
    }
    "localhost".to_string()
}

fn memory_mib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_total_kib(&text).map(|kib| kib / 1024)
}

/// The `MemTotal:   16318756 kB` line, in KiB.
fn parse_mem_total_kib(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let amount: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => Some(amount),
        Some(_) => None,
    }
}

fn disk_free_mib(work_dir: &Path) -> Option<u64> {
    let existing = work_dir.ancestors().find(|p| {
        let p = if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        };
        p.exists()
    })?;
    let existing = if existing.as_os_str().is_empty() {
        Path::new(".")
    } else {
        existing
    };
    let path = CString::new(existing.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data; zeroed is a valid value to be overwritten.
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `stats` is a valid out-pointer.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut stats) };
    if rc != 0 {
        return None;
    }
    let bytes = (stats.f_bavail as u64).saturating_mul(stats.f_frsize as u64);
    Some(bytes / MIB)
}

/// Parses `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader` output
/// (`0, Tesla V100-SXM2-16GB, 16160 MiB`). Model names keep letters and digits and turn
/// anything else into `-`, so they can be written in `gpu_model`.
pub fn parse_nvidia_smi(output: &str) -> Result<Vec<Device>, DeviceError> {
    let mut devices = Vec::new();
    for line in output.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let bad = |why: &str| DeviceError::Syntax {
            part: line.to_string(),
            why: why.to_string(),
        };
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [index, name, memory] = fields.as_slice() else {
            return Err(bad("expected `index, name, memory.total`"));
        };
        let index: u32 = index
            .parse()
            .map_err(|_| bad("the index is not a number"))?;
        let memory = memory
            .strip_suffix("MiB")
            .map(str::trim)
            .ok_or_else(|| bad("memory.total is not `N MiB`"))?;
        let memory_mib: u64 = memory
            .parse()
            .map_err(|_| bad("memory.total is not `N MiB`"))?;
        let model: String = name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        devices.push(Device {
            index,
            model,
            memory_mib,
        });
    }
    DeviceState::new(devices.clone())?;
    Ok(devices)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_cpus_memory_and_disk() {
        let dir = tempfile::tempdir().unwrap();
        let resources = detect_resources(dir.path());
        assert!(resources.milli("cpus") >= MILLI, "{resources}");
        assert!(resources.milli("mem") > 0, "{resources}");
        assert!(resources.milli("disk") > 0, "{resources}");
    }

    #[test]
    fn missing_work_dir_measures_its_existing_ancestor() {
        let dir = tempfile::tempdir().unwrap();
        let resources = detect_resources(&dir.path().join("not/yet/there"));
        assert!(resources.milli("disk") > 0, "{resources}");
        let relative = detect_resources(Path::new("no-such-relative-dir/x"));
        assert!(relative.milli("disk") > 0, "{relative}");
    }

    #[test]
    fn reads_mem_total() {
        let text = "MemTotal:       16318756 kB\nMemFree:         1000 kB\n";
        assert_eq!(parse_mem_total_kib(text), Some(16_318_756));
        assert_eq!(parse_mem_total_kib("MemFree: 1 kB"), None);
        assert_eq!(parse_mem_total_kib("MemTotal: lots kB"), None);
    }

    #[test]
    fn hostname_is_not_empty() {
        assert!(!detect_hostname().is_empty());
    }

    #[test]
    fn parses_nvidia_smi_samples() {
        let sample = "0, Tesla V100-SXM2-16GB, 16160 MiB\n1, NVIDIA A100-SXM4-80GB, 81920 MiB\n";
        let d = parse_nvidia_smi(sample).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(
            (d[0].index, d[0].model.as_str(), d[0].memory_mib),
            (0, "Tesla-V100-SXM2-16GB", 16160)
        );
        assert_eq!(d[1].memory_mib, 81920);
        assert!(parse_nvidia_smi("").unwrap().is_empty());
        assert!(parse_nvidia_smi("0, X, 16 GB").is_err());
        assert!(parse_nvidia_smi("zero, X, 16 MiB").is_err());
        assert!(parse_nvidia_smi("0, X, 1 MiB\n0, Y, 1 MiB").is_err());
        assert!(parse_nvidia_smi("NVIDIA-SMI has failed").is_err());
    }
}
