//! `orchctl embed` and `orchctl rerank`: the server's embeddings (`/v1/embeddings`) and
//! rerank (`/v1/rerank`) from the command line.

use serde_json::{json, Value};

use super::client::{Ctl, CALL_TIMEOUT};
use super::error::CtlError;
use super::table;
use super::Output;

/// The inputs of `texts`, or one per line of `file` (`-`: stdin), blank lines left out.
pub fn inputs(texts: &[String], file: Option<&std::path::Path>) -> Result<Vec<String>, CtlError> {
    let Some(path) = file else {
        return Ok(texts.to_vec());
    };
    let read = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(path)
    };
    let text =
        read.map_err(|e| CtlError::Failed(format!("cannot read {}: {e}", path.display())))?;
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .chain(texts.iter().cloned())
        .collect())
}

/// Each input's vector: its index, length and first values (all of them with `--json`).
pub async fn embed(
    ctl: &Ctl,
    inputs: Vec<String>,
    model: Option<&str>,
    dimensions: Option<u32>,
) -> Result<Output, CtlError> {
    if inputs.is_empty() {
        return Err(CtlError::Failed(
            "nothing to embed: give texts or --file".into(),
        ));
    }
    let mut body = json!({"input": inputs, "encoding_format": "float"});
    if let Some(m) = model {
        body["model"] = json!(m);
    }
    if let Some(d) = dimensions {
        body["dimensions"] = json!(d);
    }
    let v: Value = ctl
        .post("/v1/embeddings", Some(&body), CALL_TIMEOUT)
        .await?;
    let rows: Vec<Vec<String>> = v["data"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|d| {
            let e = d["embedding"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default();
            let head: Vec<String> = e
                .iter()
                .take(4)
                .map(|x| format!("{:.4}", x.as_f64().unwrap_or(f64::NAN)))
                .collect();
            vec![
                d["index"].to_string(),
                e.len().to_string(),
                format!("{} …", head.join(" ")),
            ]
        })
        .collect();
    let human = format!(
        "{}{} tokens, model {}\n",
        table::render(&["INPUT", "DIMS", "VECTOR"], &rows),
        v["usage"]["prompt_tokens"],
        v["model"].as_str().unwrap_or("?")
    );
    Ok(Output { human, json: v })
}

/// The documents by relevance to the query, best first.
pub async fn rerank(
    ctl: &Ctl,
    query: &str,
    documents: Vec<String>,
    model: Option<&str>,
    top_n: Option<usize>,
) -> Result<Output, CtlError> {
    if documents.is_empty() {
        return Err(CtlError::Failed(
            "nothing to rank: give documents or --file".into(),
        ));
    }
    let mut body = json!({"query": query, "documents": documents, "return_documents": true});
    if let Some(m) = model {
        body["model"] = json!(m);
    }
    if let Some(n) = top_n {
        body["top_n"] = json!(n);
    }
    let v: Value = ctl.post("/v1/rerank", Some(&body), CALL_TIMEOUT).await?;
    let rows: Vec<Vec<String>> = v["results"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|r| {
            vec![
                r["index"].to_string(),
                format!("{:.4}", r["relevance_score"].as_f64().unwrap_or(f64::NAN)),
                r["document"]["text"]
                    .as_str()
                    .unwrap_or("")
                    .chars()
                    .take(60)
                    .collect(),
            ]
        })
        .collect();
    Ok(Output {
        human: table::render(&["DOC", "SCORE", "TEXT"], &rows),
        json: v,
    })
}
