//! `GET /console/history` (FC-CON-2): the console's last minutes, as `console_history.rs`
//! notes them.

use axum::extract::State;
use axum::Json;
use serde::Serialize;

use crate::app_state::SharedState;
use crate::console_history::{Step, EVERY};

/// `GET /console/history`.
#[derive(Debug, Serialize)]
pub struct HistoryBody {
    pub every_ms: u64,
    pub steps: Vec<Step>,
}

pub async fn history(State(state): State<SharedState>) -> Json<HistoryBody> {
    Json(HistoryBody {
        every_ms: EVERY.as_millis() as u64,
        steps: state.console_history.steps(),
    })
}
