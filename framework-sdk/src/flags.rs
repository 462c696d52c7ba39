//! Command-line flags shared by framework-side clients (`ringmaster-exec`, the load generator).

/// A clap value parser for `--master`: one `HOST:PORT` or a comma-separated list of them
/// (every master of a replicated cluster, `a:5050,b:5050,c:5050`); the value is kept as given
/// ([`crate::FrameworkConfig::master`] takes the list as text). Clap names the flag in its
/// error: `invalid value 'a:1,b' for '--master <MASTER>': entry `b`: expected HOST:PORT`.
pub fn master_list(value: &str) -> Result<String, String> {
    ringmaster_proto::masters::parse_master_list(value)?;
    Ok(value.to_string())
}

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

#[cfg(test)]
mod tests {
    #[test]
    fn master_flags_take_lists() {
        assert_eq!(super::master_list("a:1,b:2").unwrap(), "a:1,b:2");
        assert_eq!(super::master_list("m:5050").unwrap(), "m:5050");
        assert_eq!(
            super::master_list("a:1,b").unwrap_err(),
            "entry `b`: expected HOST:PORT"
        );
    }
}
