//! TLS material for tests, made with the `openssl` command (Debian's `openssl`, installed by
//! `scripts/zookeeper.sh install`): a CA, a server certificate for 127.0.0.1 and localhost, and
//! a client certificate, all PEM, in a temporary directory. Each call makes a new, unrelated CA,
//! so two of them serve as "the right CA" and "a wrong one".

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::zookeeper::TempDir;

pub struct TestPki {
    dir: TempDir,
}

impl TestPki {
    pub fn generate() -> TestPki {
        let dir = TempDir::new("zklock-pki");
        let d = dir.path();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(d)
                .output()
                .unwrap_or_else(|e| panic!("cannot run openssl (run scripts/zookeeper.sh install): {e}"));
            assert!(out.status.success(), "openssl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        };
        let days = "2";
        openssl(
            &["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem"]
                .into_iter()
                .chain(["-days", days, "-subj", "/CN=zklock test CA"])
                .collect::<Vec<_>>(),
        );
        // Extensions make X.509 v3 certificates, the only version rustls accepts.
        for (ext, text) in [
            ("server.ext", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"),
            ("client.ext", "extendedKeyUsage=clientAuth\n"),
        ] {
            std::fs::write(d.join(ext), text).unwrap_or_else(|e| panic!("cannot write {ext}: {e}"));
        }
        for name in ["server", "client"] {
            let ext = format!("{name}.ext");
            let (key, csr, cert) = (format!("{name}.key"), format!("{name}.csr"), format!("{name}.crt"));
            // PKCS#8 keys: what both ZooKeeper's PEM key store and rustls read.
            openssl(&["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", &key]);
            openssl(&["req", "-new", "-key", &key, "-out", &csr, "-subj", &format!("/CN=zklock test {name}")]);
            let mut sign = vec!["x509", "-req", "-in", &csr, "-CA", "ca.pem", "-CAkey", "ca.key"];
            sign.extend(["-CAcreateserial", "-out", &cert, "-days", days, "-extfile", &ext]);
            openssl(&sign);
        }
        // ZooKeeper's PEM key store: the key and its certificate in one file.
        let server = [read(&d.join("server.key")), read(&d.join("server.crt"))].concat();
        std::fs::write(d.join("server.pem"), server).unwrap_or_else(|e| panic!("cannot write server.pem: {e}"));
        TestPki { dir }
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn ca_pem(&self) -> String {
        read(&self.path("ca.pem"))
    }

    /// The client's certificate and key.
    pub fn client_pem(&self) -> (String, String) {
        (read(&self.path("client.crt")), read(&self.path("client.key")))
    }

    /// zoo.cfg lines for a Netty server with a TLS client port that requires client certificates
    /// signed by this CA.
    pub fn server_cfg(&self, secure_port: u16) -> String {
        format!(
            "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\nsecureClientPort={secure_port}\n\
             secureClientPortAddress=127.0.0.1\nssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
             ssl.trustStore.location={}\nssl.trustStore.type=PEM\nssl.clientAuth=need\n",
            self.path("server.pem").display(),
            self.path("ca.pem").display(),
        )
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}
