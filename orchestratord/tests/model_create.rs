//! MOD-CREATE-1..4 (issue 50): `/api/create` as Ollama's users call it — the official `ollama`
//! Python client (`ci/ollama_create_check.py`) makes models from the folder's real default model
//! with a system prompt, sampling defaults and a chat template (by built-in name and as Jinja),
//! and checks that each changes what the model is sent and how it answers, that a request's own
//! fields win, that a model made again under its own name changes in place, and what is refused
//! (the base itself, served by a configured pool, cannot be deleted: 409).
//! Then, here: what is on disk — each made model's file shares the base's, its recipe beside it,
//! and a deleted one leaves nothing. A real server process, the real model, real sockets.

mod support;

use std::path::Path;

use support::procs::*;

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|f| f.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_made_with_a_recipe_answer_as_it_says() {
    let dir = scratch("create");
    let base = dir.join("smol.gguf");
    if std::fs::hard_link(support::default_model_path(), &base).is_err() {
        std::fs::copy(support::default_model_path(), &base).unwrap();
    }
    let (_p, url) = server_env(
        &format!(
            "[[pools]]\nid = \"conf\"\nmodel = \"{}\"\nslots = 1\nctx = 512\n\n[models]\ndirs = [\"{}\"]\non_demand = true\nslots = 1\nctx = 512\n",
            base.display(),
            dir.display()
        ),
        &[],
    )
    .await;
    let out = support::run_sdk_script(
        "ollama_create_check.py",
        &["--host".into(), url.into(), "--base".into(), "smol".into()],
    )
    .await;
    assert!(out.contains("all ollama create checks passed"));
    // the made models share the base's file; "pirate" (deleted) left nothing behind
    assert_eq!(
        names_in(&dir),
        vec![
            "smol-llama3.gguf",
            "smol-llama3.recipe.json",
            "smol-plain.gguf",
            "smol-plain.recipe.json",
            "smol.gguf",
        ]
    );
    let size = std::fs::metadata(&base).unwrap().len();
    assert_eq!(
        std::fs::metadata(dir.join("smol-plain.gguf"))
            .unwrap()
            .len(),
        size
    );
    let recipe: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("smol-plain.recipe.json")).unwrap())
            .unwrap();
    assert_eq!(recipe["from"], "smol", "{recipe}");
}
