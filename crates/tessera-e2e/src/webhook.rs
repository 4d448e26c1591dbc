//! Tessera's admission webhooks served to the real API server over TLS on
//! loopback: a CA and a serving certificate for `127.0.0.1` made with
//! openssl, and the chart's own webhook configurations (rules,
//! namespaceSelector, matchConditions, failurePolicy) with the Service
//! reference replaced by the loopback URL and the CA put in `caBundle`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use base64::Engine;
use serde_json::{Value, json};

use crate::plane::ControlPlane;

/// The webhook's certificate files and the CA that signed them (PEM).
pub struct Certs {
    pub ca_pem: String,
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .context("running openssl")?;
    if !out.status.success() {
        bail!(
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A CA and a serving certificate for IP 127.0.0.1 under `dir`.
pub fn make_certs(dir: &Path) -> Result<Certs> {
    std::fs::create_dir_all(dir)?;
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=tessera-e2e-webhook-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ],
    )?;
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "tls.key",
            "-out",
            "tls.csr",
        ],
    )?;
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )?;
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "tls.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "san.ext",
            "-out",
            "tls.crt",
        ],
    )?;
    Ok(Certs {
        ca_pem: std::fs::read_to_string(dir.join("ca.crt"))?,
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    })
}

/// The chart's Validating- and MutatingWebhookConfigurations rendered with
/// `values`, each webhook's `clientConfig` pointed at
/// `https://127.0.0.1:<port><its path>` with `ca_pem` as its CA bundle.
pub fn loopback_configs(
    plane: &ControlPlane,
    values: &Value,
    port: u16,
    ca_pem: &str,
) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for doc in plane.render_chart(values)? {
        let kind = doc["kind"].as_str().unwrap_or_default().to_string();
        if kind != "ValidatingWebhookConfiguration" && kind != "MutatingWebhookConfiguration" {
            continue;
        }
        let mut doc = doc;
        let Some(hooks) = doc["webhooks"].as_array_mut() else {
            bail!("{kind} without webhooks");
        };
        for h in hooks {
            let path = h["clientConfig"]["service"]["path"]
                .as_str()
                .unwrap_or("/")
                .to_string();
            h["clientConfig"] = json!({
                "url": format!("https://127.0.0.1:{port}{path}"),
                "caBundle": base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes()),
            });
        }
        out.push(doc);
    }
    if out.is_empty() {
        bail!("the chart rendered no webhook configuration with {values}");
    }
    Ok(out)
}

/// Certificates for the webhook and the scheduler arguments that serve it on a
/// free loopback port, as the chart's scheduler Deployment passes them.
pub fn scheduler_args(plane: &ControlPlane) -> Result<(Vec<String>, u16, Certs)> {
    let certs = make_certs(&plane.dir.path().join("webhook-tls"))?;
    let port = crate::plane::free_port();
    let args = vec![
        format!("--webhook-listen=127.0.0.1:{port}"),
        format!("--webhook-cert={}", certs.cert.display()),
        format!("--webhook-key={}", certs.key.display()),
        "--allocation-writer=system:serviceaccount:tessera-system:tessera-scheduler".into(),
        "--webhook-set-scheduler-name".into(),
    ];
    Ok((args, port, certs))
}
