//! The byte streams a [`Connection`](crate::Connection) runs over: plain TCP or TLS.
//!
//! Every component opens its stream here, so plain and TLS connections share all the framing
//! and protocol code above: both become a [`BoxedStream`]. TLS uses rustls with the `ring`
//! provider only (no system libraries). Certificates and keys are read from PEM files, and
//! every error names the file it is about.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::security::{AuthRole, Credential};
use crate::{Authenticate, HelloAck};

/// Anything a connection can run over.
pub trait ByteStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> ByteStream for T {}

/// A plain or TLS stream behind one type.
pub type BoxedStream = Box<dyn ByteStream>;

/// The first byte of every TLS record carrying a handshake (a ClientHello).
pub const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// A certificate, key or CA file that could not be used.
#[derive(Debug, thiserror::Error)]
#[error("{what} {}: {problem}", file.display())]
pub struct TlsFileError {
    /// `TLS certificate`, `TLS key`, `TLS CA`.
    pub what: &'static str,
    pub file: PathBuf,
    pub problem: String,
}

fn file_error(what: &'static str, file: &Path, problem: impl Into<String>) -> TlsFileError {
    TlsFileError {
        what,
        file: file.to_path_buf(),
        problem: problem.into(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file (at least one).
pub fn load_certificates(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let bytes =
        std::fs::read(path).map_err(|e| file_error(what, path, format!("cannot read: {e}")))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(what, path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(file_error(
            what,
            path,
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(certs)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsFileError> {
    const WHAT: &str = "TLS key";
    let bytes =
        std::fs::read(path).map_err(|e| file_error(WHAT, path, format!("cannot read: {e}")))?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|e| file_error(WHAT, path, format!("holds no usable PEM private key: {e}")))
}

fn root_store(ca: &Path) -> Result<rustls::RootCertStore, TlsFileError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certificates("TLS CA", ca)? {
        roots
            .add(cert)
            .map_err(|e| file_error("TLS CA", ca, format!("unusable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// Where a master's TLS material lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsServerFiles {
    /// The master's certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// The master's private key (PEM).
    pub key: PathBuf,
    /// When set, clients must present a certificate signed by this CA (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

impl TlsServerFiles {
    /// Reads the files and builds the acceptor the master wraps each accepted socket with.
    pub fn acceptor(&self) -> Result<TlsAcceptor, TlsFileError> {
        let certs = load_certificates("TLS certificate", &self.cert)?;
        let key = load_private_key(&self.key)?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| file_error("TLS certificate", &self.cert, e.to_string()))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(root_store(ca)?),
                    provider(),
                )
                .build()
                .map_err(|e| file_error("TLS CA", ca, e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder.with_single_cert(certs, key).map_err(|e| {
            file_error(
                "TLS certificate",
                &self.cert,
                format!("does not match the key {}: {e}", self.key.display()),
            )
        })?;
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// How a client reaches a TLS master: the CA that signed the master's certificate and, for
/// mutual TLS, the client's own certificate and key.
#[derive(Clone)]
pub struct TlsClient {
    connector: TlsConnector,
    ca: PathBuf,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient").field("ca", &self.ca).finish()
    }
}

impl TlsClient {
    /// Trusts the certificates in `ca`; presents `identity` (certificate, key) when given.
    pub fn load(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<Self, TlsFileError> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| file_error("TLS CA", ca, e.to_string()))?
            .with_root_certificates(root_store(ca)?);
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let certs = load_certificates("TLS client certificate", cert)?;
                let key_der = load_private_key(key)?;
                builder.with_client_auth_cert(certs, key_der).map_err(|e| {
                    file_error(
                        "TLS client certificate",
                        cert,
                        format!("does not match the key {}: {e}", key.display()),
                    )
                })?
            }
        };
        Ok(TlsClient {
            connector: TlsConnector::from(Arc::new(config)),
            ca: ca.to_path_buf(),
        })
    }

    /// The CA file this client trusts.
    pub fn ca(&self) -> &Path {
        &self.ca
    }
}

/// The name a master's certificate must carry for `addr` (`host:port` or `[v6]:port`).
pub fn server_name(addr: &str) -> io::Result<ServerName<'static>> {
    let host = match addr.rsplit_once(':') {
        Some((host, port)) if port.parse::<u16>().is_ok() => host,
        _ => addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{host:?} is not a usable TLS server name: {e}"),
        )
    })
}

/// Connects to `addr` within `timeout`, over TLS when `tls` is given. The error says which step
/// failed (TCP connect or TLS handshake).
pub async fn connect(
    addr: &str,
    tls: Option<&TlsClient>,
    timeout: Duration,
) -> io::Result<BoxedStream> {
    let work = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| io::Error::new(e.kind(), format!("cannot connect to {addr}: {e}")))?;
        let _ = tcp.set_nodelay(true);
        match tls {
            None => Ok(Box::new(tcp) as BoxedStream),
            Some(tls) => {
                let name = server_name(addr)?;
                let stream = tls.connector.connect(name, tcp).await.map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!(
                            "TLS handshake with {addr} failed (trusting CA {}): {e}",
                            tls.ca.display()
                        ),
                    )
                })?;
                Ok(Box::new(stream) as BoxedStream)
            }
        }
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("connecting to {addr} timed out after {timeout:?}"),
        )
    })?
}

/// Opens a stream to a master through memory instead of the network: the master's built-in
/// clients (the jobs framework) reach their own master this way, so they need neither a CA
/// for the master's certificate nor a listening address (docs/jobs.md). The stream still
/// carries the whole protocol, authentication included.
#[derive(Clone)]
pub struct Dialer(Arc<DialFn>);

type DialFn =
    dyn Fn() -> Pin<Box<dyn Future<Output = io::Result<BoxedStream>> + Send>> + Send + Sync;

impl Dialer {
    pub fn new<F, Fut>(dial: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = io::Result<BoxedStream>> + Send + 'static,
    {
        Dialer(Arc::new(move || Box::pin(dial())))
    }

    async fn dial(&self) -> io::Result<BoxedStream> {
        (self.0)().await
    }
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Dialer(in-process)")
    }
}

/// How a client secures its connections: TLS (when the master serves TLS) and a credential
/// (when it authenticates). The default is plain TCP and anonymous, as before security existed.
/// With a `dialer` the client connects through it instead (in-process; no TCP, no TLS).
#[derive(Clone, Debug, Default)]
pub struct ClientSecurity {
    pub tls: Option<TlsClient>,
    pub credential: Option<Credential>,
    pub dialer: Option<Dialer>,
}

impl PartialEq for ClientSecurity {
    fn eq(&self, other: &Self) -> bool {
        self.tls.as_ref().map(TlsClient::ca) == other.tls.as_ref().map(TlsClient::ca)
            && self.credential == other.credential
            && match (&self.dialer, &other.dialer) {
                (Some(a), Some(b)) => Arc::ptr_eq(&a.0, &b.0),
                (a, b) => a.is_none() && b.is_none(),
            }
    }
}

impl ClientSecurity {
    /// Builds the security of a command-line client from its flags (`--tls-ca`, `--tls-cert`,
    /// `--tls-key`, `--principal`, `--secret-file`), checking they come in usable combinations.
    /// Errors name the flag and the file.
    pub fn from_flags(
        tls_ca: Option<&Path>,
        tls_cert: Option<&Path>,
        tls_key: Option<&Path>,
        principal: Option<&str>,
        secret_file: Option<&Path>,
    ) -> Result<Self, String> {
        let identity = match (tls_cert, tls_key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err("--tls-cert and --tls-key go together".into()),
        };
        let tls = match tls_ca {
            Some(ca) => Some(TlsClient::load(ca, identity).map_err(|e| format!("--tls-ca: {e}"))?),
            None if identity.is_some() => {
                return Err("--tls-cert/--tls-key need --tls-ca (the CA of the master)".into())
            }
            None => None,
        };
        let credential = match (principal, secret_file) {
            (Some(principal), Some(file)) => Some(
                Credential::from_secret_file(principal, file)
                    .map_err(|e| format!("--principal/--secret-file: {e}"))?,
            ),
            (None, None) => None,
            (Some(_), None) => return Err("--principal needs --secret-file".into()),
            (None, Some(_)) => return Err("--secret-file needs --principal".into()),
        };
        Ok(ClientSecurity {
            tls,
            credential,
            dialer: None,
        })
    }

    /// Connects to `addr` (over TLS when configured; through the dialer when there is one,
    /// which ignores `addr`); see [`connect`].
    pub async fn connect(&self, addr: &str, timeout: Duration) -> io::Result<BoxedStream> {
        match &self.dialer {
            Some(dialer) => tokio::time::timeout(timeout, dialer.dial())
                .await
                .map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("connecting in-process timed out after {timeout:?}"),
                    )
                })?,
            None => connect(addr, self.tls.as_ref(), timeout).await,
        }
    }

    /// What to send after `ack` for `role`: `Ok(Some(Authenticate))` with a credential,
    /// `Ok(None)` to go on anonymously, `Err` when the master requires authentication and this
    /// client has no credential (retrying cannot help).
    pub fn authenticate(
        &self,
        ack: &HelloAck,
        role: AuthRole,
    ) -> Result<Option<Authenticate>, String> {
        match &self.credential {
            Some(credential) => Ok(Some(credential.answer(ack, role))),
            None if ack.auth_required => Err(format!(
                "the master requires authentication: give this {role} a principal and its \
                 secret (--principal NAME --secret-file FILE)"
            )),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_from_addresses() {
        assert!(matches!(
            server_name("127.0.0.1:5050").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name("[::1]:5050").unwrap(),
            ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name("master.example:5050").unwrap(),
            ServerName::DnsName(_)
        ));
    }

    #[test]
    fn security_flags_come_in_pairs() {
        let p = Path::new;
        let cases: [(_, _, _, _, _, &str); 5] = [
            (
                None,
                Some(p("c")),
                None,
                None,
                None,
                "--tls-cert and --tls-key",
            ),
            (
                None,
                Some(p("c")),
                Some(p("k")),
                None,
                None,
                "need --tls-ca",
            ),
            (
                None,
                None,
                None,
                Some("alice"),
                None,
                "--principal needs --secret-file",
            ),
            (
                None,
                None,
                None,
                None,
                Some(p("s")),
                "--secret-file needs --principal",
            ),
            (
                None,
                None,
                None,
                Some("alice"),
                Some(p("/nonexistent/alice.secret")),
                "/nonexistent/alice.secret",
            ),
        ];
        for (ca, cert, key, principal, secret, word) in cases {
            let err = ClientSecurity::from_flags(ca, cert, key, principal, secret).unwrap_err();
            assert!(err.contains(word), "{err:?} should mention {word}");
        }
        let anonymous = ClientSecurity::from_flags(None, None, None, None, None).unwrap();
        assert_eq!(anonymous, ClientSecurity::default());
    }

    #[test]
    fn authenticate_answers_the_challenge_or_explains_what_is_missing() {
        let ack = HelloAck {
            challenge: vec![9; 32],
            auth_required: true,
            ..Default::default()
        };
        let err = ClientSecurity::default()
            .authenticate(&ack, AuthRole::Agent)
            .unwrap_err();
        assert!(err.contains("--principal"), "{err}");
        let open = HelloAck {
            auth_required: false,
            ..ack.clone()
        };
        assert!(ClientSecurity::default()
            .authenticate(&open, AuthRole::Agent)
            .unwrap()
            .is_none());
        let security = ClientSecurity {
            credential: Some(Credential::new("rack", b"s".to_vec()).unwrap()),
            ..Default::default()
        };
        let answer = security
            .authenticate(&ack, AuthRole::Agent)
            .unwrap()
            .unwrap();
        assert_eq!(
            (answer.principal.as_str(), answer.role.as_str()),
            ("rack", "agent")
        );
        assert!(crate::security::verify_mac(
            b"s",
            &ack.challenge,
            "rack",
            "agent",
            &answer.mac
        ));
    }

    #[test]
    fn file_errors_name_the_file() {
        let missing = Path::new("/nonexistent/ringmaster/ca.pem");
        let err = TlsClient::load(missing, None).unwrap_err().to_string();
        assert!(
            err.contains("/nonexistent/ringmaster/ca.pem") && err.contains("TLS CA"),
            "{err}"
        );
        let dir = std::env::temp_dir().join(format!("rm-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let err = load_certificates("TLS certificate", &junk)
            .unwrap_err()
            .to_string();
        assert!(err.contains("junk.pem") && err.contains("no PEM"), "{err}");
        let err = load_private_key(&junk).unwrap_err().to_string();
        assert!(err.contains("junk.pem") && err.contains("TLS key"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
