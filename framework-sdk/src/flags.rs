//! Command-line flags shared by framework-side clients (`ringmaster-exec`, the load generator).

/// The flags every framework-side command-line client shares for TLS and authentication.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SecurityFlags {
    /// Connect over TLS, trusting the master certificate's CA in this PEM file.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Client certificate (PEM) for a master that requires mutual TLS; needs --tls-key.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Principal to authenticate as (needs --secret-file).
    #[arg(long, value_name = "NAME")]
    pub principal: Option<String>,
    /// File holding the principal's shared secret (one trailing newline is ignored).
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<std::path::PathBuf>,
}

impl SecurityFlags {
    /// Loads the files the flags name; the error names the flag and the file.
    pub fn load(&self) -> Result<ringmaster_proto::transport::ClientSecurity, String> {
        ringmaster_proto::transport::ClientSecurity::from_flags(
            self.tls_ca.as_deref(),
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
            self.principal.as_deref(),
            self.secret_file.as_deref(),
        )
    }
}
