//! Challenge-response authentication shared by the master and every client.
//!
//! A principal's secret never crosses the wire: the master puts a fresh random challenge in
//! its `HelloAck`, the client answers `HMAC-SHA256(secret, challenge || principal || role)` in
//! an `Authenticate`, and the master recomputes and compares in constant time. Both sides
//! compute the MAC here so they cannot disagree on the byte layout.

use std::fmt;
use std::path::Path;

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

use crate::{Authenticate, HelloAck};

/// Length of the random challenge in a `HelloAck`.
pub const CHALLENGE_BYTES: usize = 32;

/// The role a principal authenticates for; its wire name goes into the MAC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AuthRole {
    Agent,
    Framework,
    /// Another master of the same replication group (docs/architecture.md).
    Master,
}

impl AuthRole {
    /// The wire and configuration name: `agent` or `framework`.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthRole::Agent => "agent",
            AuthRole::Framework => "framework",
            AuthRole::Master => "master",
        }
    }

    /// Parses a wire or configuration name.
    pub fn parse(name: &str) -> Option<AuthRole> {
        match name {
            "agent" => Some(AuthRole::Agent),
            "framework" => Some(AuthRole::Framework),
            "master" => Some(AuthRole::Master),
            _ => None,
        }
    }
}

impl fmt::Display for AuthRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A fresh challenge from the operating system's secure random source.
pub fn new_challenge() -> Result<[u8; CHALLENGE_BYTES], ring::error::Unspecified> {
    let mut challenge = [0u8; CHALLENGE_BYTES];
    SystemRandom::new().fill(&mut challenge)?;
    Ok(challenge)
}

fn mac_input(challenge: &[u8], principal: &str, role: &str) -> Vec<u8> {
    let mut input = Vec::with_capacity(challenge.len() + principal.len() + role.len());
    input.extend_from_slice(challenge);
    input.extend_from_slice(principal.as_bytes());
    input.extend_from_slice(role.as_bytes());
    input
}

/// `HMAC-SHA256(secret, challenge || principal || role)`.
pub fn auth_mac(secret: &[u8], challenge: &[u8], principal: &str, role: &str) -> Vec<u8> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    hmac::sign(&key, &mac_input(challenge, principal, role))
        .as_ref()
        .to_vec()
}

/// True when `mac` is the right answer; the comparison takes the same time wherever it differs.
pub fn verify_mac(
    secret: &[u8],
    challenge: &[u8],
    principal: &str,
    role: &str,
    mac: &[u8],
) -> bool {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    hmac::verify(&key, &mac_input(challenge, principal, role), mac).is_ok()
}

/// Why a credential could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("principal name is empty")]
    EmptyPrincipal,
    #[error("principal name {0:?} has spaces or control characters")]
    BadPrincipal(String),
    #[error("cannot read secret file {path}: {error}")]
    Unreadable { path: String, error: std::io::Error },
    #[error("secret file {path} is empty")]
    EmptySecret { path: String },
    /// Group or others may read or write the file (as ssh refuses a private key).
    #[error("secret file {path} is {} (mode {mode:04o}); chmod 600 {path}", open_to(*mode))]
    TooOpen { path: String, mode: u32 },
}

/// "readable by group and others", "readable and writable by group": who may do what.
fn open_to(mode: u32) -> String {
    let who = |group: u32, others: u32| match (mode & group != 0, mode & others != 0) {
        (true, true) => Some("group and others"),
        (true, false) => Some("group"),
        (false, true) => Some("others"),
        (false, false) => None,
    };
    match (who(0o040, 0o004), who(0o020, 0o002)) {
        (Some(r), Some(w)) if r == w => format!("readable and writable by {r}"),
        (Some(r), Some(w)) => format!("readable by {r} and writable by {w}"),
        (Some(r), None) => format!("readable by {r}"),
        (None, Some(w)) => format!("writable by {w}"),
        (None, None) => "private".to_string(),
    }
}

/// A principal and its shared secret, as a client holds them. `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    principal: String,
    secret: Vec<u8>,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credential")
            .field("principal", &self.principal)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// Checks a principal name: not empty, no whitespace or control characters.
pub fn check_principal(name: &str) -> Result<(), CredentialError> {
    if name.is_empty() {
        Err(CredentialError::EmptyPrincipal)
    } else if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Err(CredentialError::BadPrincipal(name.to_string()))
    } else {
        Ok(())
    }
}

/// The secret in a file: its bytes without one trailing newline (`\n` or `\r\n`).
///
/// A file that group or others may read or write is refused ([`CredentialError::TooOpen`]), as
/// ssh refuses such a private key: the mode checked is that of the file read (a symbolic link is
/// followed, as ssh does, and its target's mode counts; the check is on the open descriptor, so
/// the file checked is the file read).
pub fn read_secret_file(path: &Path) -> Result<Vec<u8>, CredentialError> {
    use std::io::Read as _;
    use std::os::unix::fs::PermissionsExt as _;
    let shown = path.display().to_string();
    let unreadable = |error| CredentialError::Unreadable {
        path: shown.clone(),
        error,
    };
    let mut file = std::fs::File::open(path).map_err(unreadable)?;
    let mode = file.metadata().map_err(unreadable)?.permissions().mode() & 0o7777;
    if mode & 0o066 != 0 {
        return Err(CredentialError::TooOpen { path: shown, mode });
    }
    let mut secret = Vec::new();
    file.read_to_end(&mut secret).map_err(unreadable)?;
    if secret.last() == Some(&b'\n') {
        secret.pop();
        if secret.last() == Some(&b'\r') {
            secret.pop();
        }
    }
    if secret.is_empty() {
        return Err(CredentialError::EmptySecret { path: shown });
    }
    Ok(secret)
}

impl Credential {
    /// A credential from a principal name and the secret's bytes.
    pub fn new(principal: impl Into<String>, secret: Vec<u8>) -> Result<Self, CredentialError> {
        let principal = principal.into();
        check_principal(&principal)?;
        if secret.is_empty() {
            return Err(CredentialError::EmptySecret {
                path: "(inline)".into(),
            });
        }
        Ok(Credential { principal, secret })
    }

    /// A credential whose secret is the content of `path` (see [`read_secret_file`]).
    pub fn from_secret_file(
        principal: impl Into<String>,
        path: &Path,
    ) -> Result<Self, CredentialError> {
        let principal = principal.into();
        check_principal(&principal)?;
        Ok(Credential {
            principal,
            secret: read_secret_file(path)?,
        })
    }

    pub fn principal(&self) -> &str {
        &self.principal
    }

    /// The `Authenticate` answering the challenge in `ack` for `role`.
    pub fn answer(&self, ack: &HelloAck, role: AuthRole) -> Authenticate {
        Authenticate {
            principal: self.principal.clone(),
            role: role.as_str().to_string(),
            mac: auth_mac(&self.secret, &ack.challenge, &self.principal, role.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mac_is_hmac_sha256_of_the_concatenation() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let mac = auth_mac(b"Jefe", b"what do ya ", "want for ", "nothing?");
        let expected = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";
        let hex: String = mac.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, expected);
    }

    #[test]
    fn verify_accepts_only_the_exact_answer() {
        let challenge = new_challenge().unwrap();
        let mac = auth_mac(b"s3cret", &challenge, "alice", "framework");
        assert!(verify_mac(
            b"s3cret",
            &challenge,
            "alice",
            "framework",
            &mac
        ));
        assert!(!verify_mac(
            b"other",
            &challenge,
            "alice",
            "framework",
            &mac
        ));
        assert!(!verify_mac(b"s3cret", &challenge, "alice", "agent", &mac));
        assert!(!verify_mac(b"s3cret", &challenge, "bob", "framework", &mac));
        assert!(!verify_mac(b"s3cret", &[0; 32], "alice", "framework", &mac));
        assert!(!verify_mac(
            b"s3cret",
            &challenge,
            "alice",
            "framework",
            &mac[..31]
        ));
        assert!(!verify_mac(
            b"s3cret",
            &challenge,
            "alice",
            "framework",
            &[]
        ));
    }

    #[test]
    fn challenges_differ() {
        assert_ne!(new_challenge().unwrap(), new_challenge().unwrap());
    }

    #[test]
    fn secret_files_lose_one_trailing_newline_and_must_not_be_empty() {
        let dir = std::env::temp_dir().join(format!("rm-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("s");
        write_0600(&file, "abc\r\n");
        assert_eq!(read_secret_file(&file).unwrap(), b"abc");
        std::fs::write(&file, "\n").unwrap();
        let err = read_secret_file(&file).unwrap_err().to_string();
        assert!(
            err.contains("is empty") && err.contains("rm-secret"),
            "{err}"
        );
        let missing = dir.join("missing");
        let err = Credential::from_secret_file("p", &missing)
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing"), "{err}");
        assert!(Credential::from_secret_file("a b", &file).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn write_0600(path: &Path, text: &str) {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    #[test]
    fn secret_files_open_to_group_or_others_are_refused_naming_the_file() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("rm-secret-mode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("rack.secret");
        write_0600(&file, "s3cret\n");
        assert_eq!(read_secret_file(&file).unwrap(), b"s3cret");
        let shown = file.display().to_string();
        for (mode, what) in [
            (0o640, "readable by group"),
            (0o604, "readable by others"),
            (0o644, "readable by group and others"),
            (0o660, "readable and writable by group"),
            (0o602, "writable by others"),
            (0o666, "readable and writable by group and others"),
            (0o624, "readable by others and writable by group"),
        ] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = read_secret_file(&file).unwrap_err();
            assert!(matches!(err, CredentialError::TooOpen { .. }), "{err:?}");
            assert_eq!(
                err.to_string(),
                format!("secret file {shown} is {what} (mode 0{mode:o}); chmod 600 {shown}")
            );
            // Every caller gets the check: credentials of clients too.
            assert!(Credential::from_secret_file("p", &file).is_err());
        }
        // Execute bits let nobody read the secret; owner-only modes are fine.
        for mode in [0o400, 0o700, 0o611] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(read_secret_file(&file).unwrap(), b"s3cret", "{mode:o}");
        }
        // A link is followed as ssh does: the mode of the file read is what counts.
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.join("link.secret");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_secret_file(&link).unwrap(), b"s3cret");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = read_secret_file(&link).unwrap_err().to_string();
        assert!(err.contains("link.secret") && err.contains("0644"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn debug_hides_the_secret() {
        let c = Credential::new("p", b"topsecret".to_vec()).unwrap();
        assert!(!format!("{c:?}").contains("topsecret"));
    }
}
