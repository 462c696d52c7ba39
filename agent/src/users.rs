//! Which Unix user a task runs as (docs/security.md, "Task users").
//!
//! A task names its user in `TaskInfo.user`; without one it runs as the agent's
//! `--task-user` (default: `nobody` when the agent runs as root, else the agent's own user).
//! Root is refused unless the agent was started with `--allow-root-tasks`, and an agent that is
//! not root can only run tasks as itself. The decision ([`resolve_task_user`]) is pure; the
//! user database is read by [`lookup_user`]. The user resolved must also be one the framework's
//! principal may use ([`check_allowed`], against `TaskInfo.allowed_users`).

use std::ffi::{CStr, CString};
use std::path::PathBuf;

/// A user a task may run as, from the user database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (with the primary group).
    pub groups: Vec<u32>,
    pub home: PathBuf,
}

/// What the agent allows: its `--task-user`, `--allow-root-tasks`, and who it runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserPolicy {
    /// The user of tasks that name none (`--task-user`).
    pub default_user: String,
    /// `--allow-root-tasks`.
    pub allow_root: bool,
    /// The agent's own (effective) uid.
    pub agent_uid: u32,
}

/// The user a task with `requested` (`TaskInfo.user`, empty: not named) runs as, or the message
/// it fails with. `lookup` reads the user database ([`lookup_user`] outside tests).
pub fn resolve_task_user(
    requested: &str,
    policy: &UserPolicy,
    lookup: impl Fn(&str) -> Option<TaskUser>,
) -> Result<TaskUser, String> {
    let name = if requested.is_empty() {
        policy.default_user.as_str()
    } else {
        requested
    };
    let Some(user) = lookup(name) else {
        return Err(format!("unknown user {name}"));
    };
    if user.uid == 0 && !policy.allow_root {
        return Err(format!(
            "tasks may not run as root on this agent (--allow-root-tasks); user {name} is uid 0"
        ));
    }
    if policy.agent_uid != 0 && user.uid != policy.agent_uid {
        return Err(format!(
            "cannot run the task as {name} (uid {}): the agent runs as uid {} and cannot \
             switch users without root",
            user.uid, policy.agent_uid
        ));
    }
    Ok(user)
}

/// Whether a task may run as `user` (the name the agent resolved: `TaskInfo.user`, else its
/// `--task-user`) given `allowed` (`TaskInfo.allowed_users`, filled by the master from the
/// framework's principal; empty: any user). The message is what the task fails with (reason
/// `not_authorized`; docs/security.md, "Task users").
pub fn check_allowed(user: &str, allowed: &[String]) -> Result<(), String> {
    if allowed.is_empty() || allowed.iter().any(|a| a == user) {
        return Ok(());
    }
    Err(format!(
        "principal's users do not include {user}: allowed {}",
        allowed.join(", ")
    ))
}

/// The default `--task-user`: `nobody` for an agent running as root, else the agent's own user
/// (its uid as a number when the user database does not know it).
pub fn default_task_user() -> String {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if euid == 0 {
        return "nobody".to_string();
    }
    user_name_of(euid).unwrap_or_else(|| euid.to_string())
}

/// The agent's effective uid.
pub fn agent_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Looks `name` up in the user database (`getpwnam_r`, then `getgrouplist`). A name of digits
/// that is no user's name is taken as a uid.
pub fn lookup_user(name: &str) -> Option<TaskUser> {
    let cname = CString::new(name).ok()?;
    let by_name = with_passwd(|pwd, buf, result| {
        // SAFETY: all pointers are valid for the call; buf outlives the result's use.
        unsafe { libc::getpwnam_r(cname.as_ptr(), pwd, buf.as_mut_ptr(), buf.len(), result) }
    });
    let found = match by_name {
        Some(found) => Some(found),
        None => {
            let uid: u32 = name.parse().ok()?;
            with_passwd(|pwd, buf, result| {
                // SAFETY: as above.
                unsafe { libc::getpwuid_r(uid, pwd, buf.as_mut_ptr(), buf.len(), result) }
            })
        }
    }?;
    let (user_name, uid, gid, home) = found;
    let groups = supplementary_groups(&user_name, gid);
    Some(TaskUser {
        name: user_name,
        uid,
        gid,
        groups,
        home,
    })
}

fn user_name_of(uid: u32) -> Option<String> {
    with_passwd(|pwd, buf, result| {
        // SAFETY: all pointers are valid for the call.
        unsafe { libc::getpwuid_r(uid, pwd, buf.as_mut_ptr(), buf.len(), result) }
    })
    .map(|(name, ..)| name)
}

type PasswdFields = (String, u32, u32, PathBuf);

/// Runs a `getpw*_r` call with a growing buffer and copies out the fields we use.
fn with_passwd(
    call: impl Fn(*mut libc::passwd, &mut Vec<libc::c_char>, *mut *mut libc::passwd) -> libc::c_int,
) -> Option<PasswdFields> {
    let mut buf: Vec<libc::c_char> = vec![0; 1024];
    loop {
        // SAFETY: passwd is plain data; zeroed is a valid value.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = call(&mut pwd, &mut buf, &mut result);
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || result.is_null() {
            return None;
        }
        // SAFETY: on success the fields point into `buf`, which is alive here.
        let name = unsafe { CStr::from_ptr(pwd.pw_name) }
            .to_string_lossy()
            .into_owned();
        let home = if pwd.pw_dir.is_null() {
            PathBuf::from("/")
        } else {
            // SAFETY: as above.
            PathBuf::from(
                unsafe { CStr::from_ptr(pwd.pw_dir) }
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        return Some((name, pwd.pw_uid, pwd.pw_gid, home));
    }
}

fn supplementary_groups(name: &str, gid: u32) -> Vec<u32> {
    let Ok(cname) = CString::new(name) else {
        return vec![gid];
    };
    let mut count: libc::c_int = 64;
    loop {
        let mut groups: Vec<libc::gid_t> = vec![0; count as usize];
        let asked = count;
        // SAFETY: groups has room for `count` entries; count is updated by the call.
        let rc =
            unsafe { libc::getgrouplist(cname.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if rc >= 0 {
            groups.truncate(count.max(0) as usize);
            if !groups.contains(&gid) {
                groups.insert(0, gid);
            }
            return groups;
        }
        if count <= asked {
            count = asked * 2;
        }
        if count > 65_536 {
            return vec![gid];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, uid: u32) -> TaskUser {
        TaskUser {
            name: name.to_string(),
            uid,
            gid: uid,
            groups: vec![uid],
            home: PathBuf::from(format!("/home/{name}")),
        }
    }

    fn db(name: &str) -> Option<TaskUser> {
        match name {
            "root" => Some(user("root", 0)),
            "nobody" => Some(user("nobody", 65534)),
            "ann" => Some(user("ann", 1000)),
            _ => None,
        }
    }

    fn policy(agent_uid: u32, allow_root: bool) -> UserPolicy {
        UserPolicy {
            default_user: if agent_uid == 0 { "nobody" } else { "ann" }.to_string(),
            allow_root,
            agent_uid,
        }
    }

    #[test]
    fn a_named_user_is_used_and_no_name_means_the_default() {
        let root_agent = policy(0, false);
        assert_eq!(resolve_task_user("ann", &root_agent, db).unwrap().uid, 1000);
        assert_eq!(
            resolve_task_user("", &root_agent, db).unwrap().name,
            "nobody"
        );
        let ann_agent = policy(1000, false);
        assert_eq!(resolve_task_user("", &ann_agent, db).unwrap().name, "ann");
    }

    #[test]
    fn root_is_refused_unless_allowed() {
        let err = resolve_task_user("root", &policy(0, false), db).unwrap_err();
        assert!(err.contains("may not run as root"), "{err}");
        assert!(err.contains("--allow-root-tasks"), "{err}");
        let mut defaults_to_root = policy(0, false);
        defaults_to_root.default_user = "root".into();
        assert!(resolve_task_user("", &defaults_to_root, db).is_err());
        assert_eq!(
            resolve_task_user("root", &policy(0, true), db).unwrap().uid,
            0
        );
    }

    #[test]
    fn the_principals_users_bound_the_resolved_user() {
        let allowed = vec!["alice".to_string(), "bob".to_string()];
        assert_eq!(check_allowed("alice", &allowed), Ok(()));
        assert_eq!(check_allowed("bob", &allowed), Ok(()));
        assert_eq!(
            check_allowed("nobody", &allowed),
            Err("principal's users do not include nobody: allowed alice, bob".to_string())
        );
        // Names are compared exactly: no prefixes, no case folding, no empty name.
        assert!(check_allowed("alic", &allowed).is_err());
        assert!(check_allowed("Alice", &allowed).is_err());
        assert!(check_allowed("", &allowed).is_err());
        // Empty: any user (no principal, or one allowed any).
        assert_eq!(check_allowed("root", &[]), Ok(()));
        assert_eq!(check_allowed("", &[]), Ok(()));
    }

    #[test]
    fn unknown_users_are_named() {
        let err = resolve_task_user("mallory", &policy(0, false), db).unwrap_err();
        assert_eq!(err, "unknown user mallory");
    }

    #[test]
    fn an_agent_that_is_not_root_runs_tasks_only_as_itself() {
        let err = resolve_task_user("nobody", &policy(1000, false), db).unwrap_err();
        assert!(err.contains("without root"), "{err}");
        assert_eq!(
            resolve_task_user("ann", &policy(1000, false), db)
                .unwrap()
                .uid,
            1000
        );
        assert!(resolve_task_user("root", &policy(1000, true), db).is_err());
    }

    #[test]
    fn the_user_database_is_read() {
        let root = lookup_user("root").expect("root exists");
        assert_eq!((root.uid, root.gid), (0, 0));
        assert!(root.groups.contains(&0));
        assert_eq!(lookup_user("0").unwrap().name, "root");
        assert!(lookup_user("no-such-user-ringmaster").is_none());
        assert!(!default_task_user().is_empty());
    }
}
