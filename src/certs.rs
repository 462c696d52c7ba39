//! `ringmaster certs`: a development CA and the certificates a TLS cluster needs, so trying
//! TLS takes one command instead of an openssl session.
//!
//! Written: `ca.pem`/`ca.key` (a self-signed CA), `master.pem`/`master.key` (signed by it, with
//! SANs `localhost`, `127.0.0.1`, `::1` and any `--san`), and for each `--client NAME` a
//! `client-NAME.pem`/`client-NAME.key` for mutual TLS. Keys are created with mode 0600.
//! These are for development and tests: production clusters should use their own CA.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// One file `write_dev_certs` wrote, and what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenFile {
    pub path: PathBuf,
    pub what: String,
}

/// The names a master certificate always carries.
pub const DEFAULT_SANS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

fn write_file(path: &Path, contents: &str, private: bool, force: bool) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true);
    if force {
        options.create(true).truncate(true);
    } else {
        options.create_new(true);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(if private { 0o600 } else { 0o644 });
    }
    let mut file = options.open(path).with_context(|| {
        if path.exists() && !force {
            format!(
                "{} already exists (pass --force to overwrite)",
                path.display()
            )
        } else {
            format!("cannot create {}", path.display())
        }
    })?;
    #[cfg(unix)]
    if private {
        // An existing file overwritten with --force keeps its old mode unless set again.
        use std::os::unix::fs::PermissionsExt as _;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot make {} private", path.display()))?;
    }
    file.write_all(contents.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

fn check_client_name(name: &str) -> anyhow::Result<()> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
    {
        bail!("--client {name:?}: use letters, digits, '-', '_' or '.'");
    }
    Ok(())
}

/// Writes a CA, a master certificate for `DEFAULT_SANS` plus `extra_sans`, and one client
/// certificate per name in `clients`, into `out` (created if missing). Refuses to overwrite
/// unless `force`.
pub fn write_dev_certs(
    out: &Path,
    extra_sans: &[String],
    clients: &[String],
    force: bool,
) -> anyhow::Result<Vec<WrittenFile>> {
    for name in clients {
        check_client_name(name)?;
    }
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;

    let ca_key = KeyPair::generate().context("generating the CA key")?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "Ringmaster development CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).context("signing the CA")?;
    let ca = Issuer::new(ca_params, &ca_key);

    let mut sans: Vec<String> = DEFAULT_SANS.iter().map(|s| s.to_string()).collect();
    for san in extra_sans {
        if san.trim().is_empty() {
            bail!("--san must not be empty");
        }
        if !sans.contains(san) {
            sans.push(san.clone());
        }
    }
    let master_key = KeyPair::generate().context("generating the master key")?;
    let mut master_params = CertificateParams::new(sans.clone())
        .with_context(|| format!("--san: not a DNS name or IP address in {sans:?}"))?;
    master_params
        .distinguished_name
        .push(DnType::CommonName, "ringmaster master");
    master_params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    master_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let master_cert = master_params
        .signed_by(&master_key, &ca)
        .context("signing the master certificate")?;

    let mut written = Vec::new();
    let mut put = |name: String, contents: String, private: bool, what: String| {
        let path = out.join(name);
        write_file(&path, &contents, private, force)?;
        written.push(WrittenFile { path, what });
        anyhow::Ok(())
    };
    put(
        "ca.pem".into(),
        ca_cert.pem(),
        false,
        "CA certificate: clients trust it (--tls-ca); master's tls.client_ca for mutual TLS".into(),
    )?;
    put(
        "ca.key".into(),
        ca_key.serialize_pem(),
        true,
        "CA private key: keep it to sign more certificates, or delete it".into(),
    )?;
    put(
        "master.pem".into(),
        master_cert.pem(),
        false,
        format!("master certificate (tls.cert), names {}", sans.join(", ")),
    )?;
    put(
        "master.key".into(),
        master_key.serialize_pem(),
        true,
        "master private key (tls.key)".into(),
    )?;
    for name in clients {
        let key = KeyPair::generate().with_context(|| format!("generating the key of {name}"))?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params
            .signed_by(&key, &ca)
            .with_context(|| format!("signing the certificate of {name}"))?;
        put(
            format!("client-{name}.pem"),
            cert.pem(),
            false,
            format!("client certificate of {name} (--tls-cert)"),
        )?;
        put(
            format!("client-{name}.key"),
            key.serialize_pem(),
            true,
            format!("client private key of {name} (--tls-key)"),
        )?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_proto::transport::{TlsClient, TlsServerFiles};

    #[test]
    fn writes_loadable_files_with_private_keys() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("certs");
        let written =
            write_dev_certs(&out, &["master.example".into()], &["agent1".into()], false).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|w| w.path.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "ca.pem",
                "ca.key",
                "master.pem",
                "master.key",
                "client-agent1.pem",
                "client-agent1.key"
            ]
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            for key in ["ca.key", "master.key", "client-agent1.key"] {
                let mode = std::fs::metadata(out.join(key))
                    .unwrap()
                    .permissions()
                    .mode();
                assert_eq!(mode & 0o777, 0o600, "{key}");
            }
        }
        let server = TlsServerFiles {
            cert: out.join("master.pem"),
            key: out.join("master.key"),
            client_ca: Some(out.join("ca.pem")),
        };
        server.acceptor().unwrap();
        TlsClient::load(
            &out.join("ca.pem"),
            Some((
                &out.join("client-agent1.pem"),
                &out.join("client-agent1.key"),
            )),
        )
        .unwrap();
        let err = write_dev_certs(&out, &[], &[], false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("already exists"), "{err}");
        write_dev_certs(&out, &[], &[], true).unwrap();
        assert!(write_dev_certs(&out, &[], &["../x".into()], true).is_err());
    }
}
