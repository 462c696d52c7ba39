//! Which device nodes a task's cgroup lets it open (cgroup v1 `devices` controller): NVIDIA
//! GPUs (character major 195) only as bound.
//!
//! A task holding GPUs may use its own `/dev/nvidiaN` (195:N, N = the device index), the shared
//! control node `/dev/nvidiactl` (195:255) and `/dev/nvidia-uvm*` (their major, read from
//! `/proc/devices`); every other 195 node (other GPUs, `/dev/nvidia-modeset` 195:254) is
//! denied. A task without GPUs gets no 195 node and no `nvidia-uvm`. Every other device stays as
//! the agent's cgroup has it.
//!
//! How: the v1 controller cannot carve an exception out of a wildcard while it allows by
//! default (`a *:* rwm`: a deny is then kept but not shown, and an allow cannot punch a hole in
//! it), so the task cgroup is switched to deny-by-default (`devices.deny a`) and given an
//! explicit allow list: the parent's entries with major 195 (and, for a task without GPUs,
//! `nvidia-uvm`) taken out — a wildcard major becomes one entry per character major registered
//! in `/proc/devices` when the task starts (a major no driver holds has no device to open) —
//! then the task's own GPU nodes. `devices.list` of the task cgroup so shows exactly what the
//! task may open. (Listing every possible major, 0–511, instead cost about 15 ms per task
//! cgroup in a debug build; the registered ones are a few dozen.) A driver loaded while a task
//! runs is not in that task's list. [`task_device_rules`] is the pure computation;
//! [`crate::isolation`] writes it with cgroups-rs' devices controller. cgroup v2 controls
//! devices with eBPF programs, which this agent does not install: there the rule is not
//! enforced (logged once at startup; docs/security.md).

use std::fmt;

/// The character major of NVIDIA's GPU nodes (`/dev/nvidia*`).
pub const NVIDIA_MAJOR: u32 = 195;
/// `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u32 = 255;
/// The `/proc/devices` name of the unified-memory driver's major.
pub const UVM_DRIVER: &str = "nvidia-uvm";

/// One line of `devices.list` / `devices.allow`: `c 195:0 rwm`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DeviceRule {
    /// `a` (all), `b` (block) or `c` (character).
    pub kind: char,
    /// `None`: any (`*`).
    pub major: Option<u32>,
    pub minor: Option<u32>,
    /// Some of `r`, `w`, `m`, in that order.
    pub access: String,
}

impl DeviceRule {
    /// A character device rule with all access.
    pub fn char(major: Option<u32>, minor: Option<u32>) -> Self {
        DeviceRule {
            kind: 'c',
            major,
            minor,
            access: "rwm".into(),
        }
    }

    /// Parses one `devices.list` line; `None` when it is not one.
    pub fn parse(line: &str) -> Option<Self> {
        let mut parts = line.split_whitespace();
        let kind = parts.next()?;
        let (major, minor) = parts.next()?.split_once(':')?;
        let access = parts.next()?;
        if parts.next().is_some() {
            return None;
        }
        let kind = match kind {
            "a" | "b" | "c" => kind.chars().next()?,
            _ => return None,
        };
        let number = |text: &str| -> Option<Option<u32>> {
            match text {
                "*" => Some(None),
                n => n.parse().ok().map(Some),
            }
        };
        if access.is_empty() || !access.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
            return None;
        }
        Some(DeviceRule {
            kind,
            major: number(major)?,
            minor: number(minor)?,
            access: access.into(),
        })
    }

    /// True when this rule allows everything `other` does.
    fn covers(&self, other: &DeviceRule) -> bool {
        (self.kind == 'a' || self.kind == other.kind)
            && (self.major.is_none() || self.major == other.major)
            && (self.minor.is_none() || self.minor == other.minor)
            && other.access.chars().all(|c| self.access.contains(c))
    }
}

impl fmt::Display for DeviceRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = |v: Option<u32>| v.map_or("*".to_string(), |v| v.to_string());
        write!(
            f,
            "{} {}:{} {}",
            self.kind,
            n(self.major),
            n(self.minor),
            self.access
        )
    }
}

/// Parses a whole `devices.list`, skipping lines that are not rules.
pub fn parse_list(text: &str) -> Vec<DeviceRule> {
    text.lines().filter_map(DeviceRule::parse).collect()
}

/// The character majors registered in `/proc/devices`, ascending, each once.
pub fn char_majors(proc_devices: &str) -> Vec<u32> {
    let mut in_char = false;
    let mut majors = Vec::new();
    for line in proc_devices.lines() {
        let line = line.trim();
        if line.ends_with(':') {
            in_char = line == "Character devices:";
            continue;
        }
        if let Some(major) = line
            .split_whitespace()
            .next()
            .filter(|_| in_char)
            .and_then(|m| m.parse().ok())
        {
            majors.push(major);
        }
    }
    majors.sort_unstable();
    majors.dedup();
    majors
}

/// The character major `name` is registered under in `/proc/devices` (its "Character devices:"
/// section), e.g. `nvidia-uvm`.
pub fn char_major(proc_devices: &str, name: &str) -> Option<u32> {
    let mut in_char = false;
    for line in proc_devices.lines() {
        let line = line.trim();
        if line.ends_with(':') {
            in_char = line == "Character devices:";
            continue;
        }
        if !in_char {
            continue;
        }
        let mut parts = line.split_whitespace();
        if let (Some(major), Some(driver)) = (parts.next(), parts.next()) {
            if driver == name {
                return major.parse().ok();
            }
        }
    }
    None
}

/// The allow list of a task cgroup switched to deny-by-default, from its parent's `devices.list`
/// (`parent`), the GPU indices the task holds (`gpus`, empty: none) and `/proc/devices` (the
/// registered character majors and `nvidia-uvm`'s). Only what the parent allows is listed (the
/// kernel refuses more).
pub fn task_device_rules(
    parent: &[DeviceRule],
    gpus: &[u32],
    proc_devices: &str,
) -> Vec<DeviceRule> {
    let registered = char_majors(proc_devices);
    let uvm_major = char_major(proc_devices, UVM_DRIVER);
    let gpu_task = !gpus.is_empty();
    let hidden = |major: u32| major == NVIDIA_MAJOR || (!gpu_task && uvm_major == Some(major));
    let mut out: Vec<DeviceRule> = Vec::new();
    let char_majors = |minor: Option<u32>, access: &str, out: &mut Vec<DeviceRule>| {
        for &major in registered.iter().filter(|m| !hidden(**m)) {
            out.push(DeviceRule {
                kind: 'c',
                major: Some(major),
                minor,
                access: access.into(),
            });
        }
    };
    for rule in parent {
        match (rule.kind, rule.major) {
            ('a', major) => {
                out.push(DeviceRule {
                    kind: 'b',
                    ..rule.clone()
                });
                match major {
                    None => char_majors(rule.minor, &rule.access, &mut out),
                    Some(m) if !hidden(m) => out.push(DeviceRule {
                        kind: 'c',
                        ..rule.clone()
                    }),
                    Some(_) => {}
                }
            }
            ('c', None) if rule.access == "m" => out.push(rule.clone()),
            ('c', None) => char_majors(rule.minor, &rule.access, &mut out),
            ('c', Some(m)) if hidden(m) => {}
            _ => out.push(rule.clone()),
        }
    }
    if gpu_task {
        let mut minors: Vec<u32> = gpus.to_vec();
        minors.sort_unstable();
        minors.dedup();
        let mut own: Vec<DeviceRule> = minors
            .into_iter()
            .chain([NVIDIACTL_MINOR])
            .map(|minor| DeviceRule::char(Some(NVIDIA_MAJOR), Some(minor)))
            .collect();
        if let Some(uvm) = uvm_major.filter(|m| *m != NVIDIA_MAJOR) {
            own.push(DeviceRule::char(Some(uvm), None));
        }
        for rule in own {
            let allowed = parent.iter().any(|p| p.covers(&rule));
            let listed = out.iter().any(|o| o.covers(&rule));
            if allowed && !listed {
                out.push(rule);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROC_DEVICES: &str = "Character devices:\n  1 mem\n  4 /dev/vc/0\n136 pts\n\
                                195 nvidia-frontend\n195 nvidia\n234 nvidia-uvm\n\
                                509 nvidia-caps\n\nBlock devices:\n  8 sd\n\
                                235 nvidia-uvm-fake\n";
    const NO_UVM: &str = "Character devices:\n  1 mem\n136 pts\n195 nvidia\n234 nvidia-caps\n\n\
                          Block devices:\n  8 sd\n";

    fn allow_all() -> Vec<DeviceRule> {
        parse_list("a *:* rwm\n")
    }

    fn lines(rules: &[DeviceRule]) -> Vec<String> {
        rules.iter().map(ToString::to_string).collect()
    }

    fn allows(rules: &[DeviceRule], major: u32, minor: u32) -> bool {
        let want = DeviceRule::char(Some(major), Some(minor));
        rules.iter().any(|r| r.covers(&want))
    }

    #[test]
    fn majors_come_from_the_character_section() {
        assert_eq!(char_major(PROC_DEVICES, UVM_DRIVER), Some(234));
        assert_eq!(char_major(PROC_DEVICES, "mem"), Some(1));
        assert_eq!(char_major(PROC_DEVICES, "sd"), None, "block, not character");
        assert_eq!(char_major("", UVM_DRIVER), None);
        assert_eq!(
            char_major("Character devices:\n x nvidia-uvm\n", UVM_DRIVER),
            None
        );
        assert_eq!(char_majors(PROC_DEVICES), [1, 4, 136, 195, 234, 509]);
        assert!(char_majors("garbage\n").is_empty());
    }

    #[test]
    fn a_gpu_task_gets_its_own_nodes_and_the_control_nodes_only() {
        let rules = task_device_rules(&allow_all(), &[2, 0], PROC_DEVICES);
        assert!(allows(&rules, 195, 0) && allows(&rules, 195, 2));
        assert!(allows(&rules, 195, 255), "nvidiactl");
        assert!(
            allows(&rules, 234, 0) && allows(&rules, 234, 1),
            "nvidia-uvm*"
        );
        for other in [1, 3, 7, 254] {
            assert!(!allows(&rules, 195, other), "195:{other}");
        }
        // Everything else as before: other registered char majors, block devices.
        assert!(allows(&rules, 1, 3), "/dev/null");
        assert!(allows(&rules, 136, 4), "ptys");
        assert!(allows(&rules, 509, 0));
        assert!(!allows(&rules, 300, 0), "no driver holds major 300");
        assert!(lines(&rules).contains(&"b *:* rwm".to_string()));
        assert!(!lines(&rules).iter().any(|l| l.starts_with("a ")));
        let own: Vec<String> = lines(&rules)
            .into_iter()
            .filter(|l| l.starts_with("c 195:"))
            .collect();
        assert_eq!(own, ["c 195:0 rwm", "c 195:2 rwm", "c 195:255 rwm"]);
        // The block wildcard, the registered char majors but 195, then the own nodes.
        assert_eq!(rules.len(), 1 + 5 + 3);
    }

    #[test]
    fn a_task_without_gpus_gets_no_nvidia_node() {
        let rules = task_device_rules(&allow_all(), &[], PROC_DEVICES);
        for minor in [0, 1, 254, 255] {
            assert!(!allows(&rules, 195, minor), "195:{minor}");
        }
        assert!(!allows(&rules, 234, 0), "no nvidia-uvm without a GPU");
        assert_eq!(
            lines(&rules),
            [
                "b *:* rwm",
                "c 1:* rwm",
                "c 4:* rwm",
                "c 136:* rwm",
                "c 509:* rwm"
            ]
        );
        // Without nvidia-uvm loaded, only 195 goes.
        let rules = task_device_rules(&allow_all(), &[], NO_UVM);
        assert!(allows(&rules, 234, 0));
        assert!(!allows(&rules, 195, 0));
    }

    #[test]
    fn a_restricted_parent_is_never_exceeded() {
        // A container-style whitelist: the task keeps it, minus the GPUs it does not hold.
        let parent = parse_list(
            "c *:* m\nb *:* m\nc 1:3 rwm\nc 136:* rwm\nc 195:0 rwm\nc 195:1 rwm\nc 195:255 rw\n",
        );
        let rules = task_device_rules(&parent, &[1], PROC_DEVICES);
        assert_eq!(
            lines(&rules),
            [
                "c *:* m",
                "b *:* m",
                "c 1:3 rwm",
                "c 136:* rwm",
                "c 195:1 rwm"
            ]
        );
        // 195:255 is only `rw` in the parent and uvm not at all: not asked for.
        let none = task_device_rules(&parent, &[], PROC_DEVICES);
        assert_eq!(
            lines(&none),
            ["c *:* m", "b *:* m", "c 1:3 rwm", "c 136:* rwm"]
        );
    }

    #[test]
    fn devices_list_lines_parse_and_print() {
        for line in ["a *:* rwm", "c 195:255 rwm", "b 8:* r", "c *:* m"] {
            assert_eq!(DeviceRule::parse(line).unwrap().to_string(), line);
        }
        for bad in [
            "",
            "x 1:2 rwm",
            "c 1 rwm",
            "c a:1 rwm",
            "c 1:2 rwx",
            "c 1:2",
            "c 1:2 r w",
        ] {
            assert_eq!(DeviceRule::parse(bad), None, "{bad:?}");
        }
        assert_eq!(parse_list("a *:* rwm\ngarbage\n").len(), 1);
    }
}
