//! The checked-in OpenAPI documents equal what the code generates (OC-CTRL-2067, ORCH-API-1).
//! Regenerate with `UPDATE_OPENAPI=1 cargo test -p orchestratord --test openapi_drift`.

use std::path::PathBuf;

use orchestratord::openapi;

fn check(name: &str, generated: String) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../contracts/openapi")
        .join(name);
    if std::env::var("UPDATE_OPENAPI").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &generated).expect("write openapi file");
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{} missing ({e}); run with UPDATE_OPENAPI=1",
            path.display()
        )
    });
    assert!(
        on_disk == generated,
        "{} drifted from the code; run UPDATE_OPENAPI=1 cargo test -p orchestratord --test openapi_drift",
        path.display()
    );
}

#[test]
fn data_plane_document_matches_the_code() {
    check("data.yaml", openapi::to_yaml(&openapi::data()));
}

#[test]
fn control_plane_document_matches_the_code() {
    check("control.yaml", openapi::to_yaml(&openapi::control()));
}

/// ADP-API-1: the adapters' document.
#[test]
fn adapters_document_matches_the_code() {
    check("adapters.yaml", openapi::to_yaml(&openapi::adapters()));
}

/// OC-CTRL-2061: info.version equals the capabilities api_version.
#[test]
fn version_matches_the_api_version() {
    assert_eq!(openapi::data().info.version, contracts::API_VERSION);
    assert_eq!(openapi::control().info.version, contracts::API_VERSION);
    assert_eq!(openapi::adapters().info.version, contracts::API_VERSION);
}

/// Every error status of every operation carries an example.
#[test]
fn every_error_response_has_an_example() {
    for doc in [openapi::data(), openapi::control(), openapi::adapters()] {
        let v = serde_json::to_value(&doc).unwrap();
        for (path, item) in v["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                for (status, resp) in op["responses"].as_object().unwrap() {
                    if status.starts_with('4') || status.starts_with('5') {
                        let ex = resp["content"]
                            .as_object()
                            .and_then(|c| c.values().next())
                            .map(|m| m.get("example").is_some() || m.get("examples").is_some());
                        assert_eq!(ex, Some(true), "{method} {path} {status} has no example");
                    }
                }
            }
        }
    }
}
