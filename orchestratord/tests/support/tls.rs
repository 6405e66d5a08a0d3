#![allow(dead_code)]
//! TLS for tests of what crosses it: a CA of the test's own, a certificate for 127.0.0.1
//! signed by it, and an acceptor that serves with it — what a hub or a reverse proxy in front
//! of the server holds. A client trusts the CA through `SSL_CERT_FILE` (the system's roots).

use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tokio::net::TcpListener;
use tokio_rustls::rustls;
use tokio_rustls::TlsAcceptor;

/// An acceptor for 127.0.0.1 and the file holding its CA's certificate (PEM).
pub fn acceptor(tag: &str) -> (TlsAcceptor, PathBuf) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap();
    let dir = crate::support::procs::scratch(tag);
    std::fs::create_dir_all(&dir).unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca_cert.pem()).unwrap();
    (TlsAcceptor::from(Arc::new(config)), ca_file)
}

/// A TLS-terminating proxy on 127.0.0.1 in front of `upstream` (`host:port`), as a reverse
/// proxy in front of the server is: its port and its CA's file.
pub async fn proxy(tag: &str, upstream: String) -> (u16, PathBuf) {
    let (tls, ca_file) = acceptor(tag);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (tls, upstream) = (tls.clone(), upstream.clone());
            tokio::spawn(async move {
                // a client that does not trust the CA ends the handshake
                let Ok(mut outer) = tls.accept(tcp).await else {
                    return;
                };
                let Ok(mut inner) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut outer, &mut inner).await;
            });
        }
    });
    (port, ca_file)
}
