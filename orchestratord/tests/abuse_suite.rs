//! The abuse suite, short (`ci/abuse.py --short`): every attack of the adversarial pass of
//! issue 32 — silent sockets, HTTP/2 prefaces, dribbled heads and bodies, oversized and
//! malformed requests, smuggling shapes, failed-key lockouts, tenant crossing, a retry storm,
//! a failed reload of a drained pool (with `RUST_BACKTRACE=1`), memory across reloads, a
//! hostile GGUF, bad worker names and frames, the record store's file deleted — against the
//! server binary on the real model. Each must hold (SEC-CONN-1..4, SEC-AUTH-3, SEC-TEN-1,
//! ORCH-ADM-RETRY-3, POOL-SM-3, ENG-ERR-1, ENG-MEM-1, WRK-AUTH-2, WRK-NAME-1, OPS-REC-6).

mod support;

use support::{default_model_path, repo_root};

#[test]
fn every_attack_of_the_abuse_suite_holds() {
    let python = std::env::var("ORCHD_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(python)
        .arg(repo_root().join("ci/abuse.py"))
        .args(["--short", "--threads", "1", "--orchd"])
        .arg(env!("CARGO_BIN_EXE_orchestratord"))
        .arg("--model")
        .arg(default_model_path())
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "an attack found a defect ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
