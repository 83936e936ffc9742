//! `GET /v1/models` and `GET /v1/models/{id}`: the one served model in OpenAI's `model`
//! shape (an unknown id is a 404 `model_not_found`). Reads the frontend state only.

use super::errors::ApiError;
use crate::frontend::server::FrontendState;
use actix_web::{web, HttpResponse};
use serde_json::{json, Value};

fn model(state: &FrontendState) -> Value {
    json!({
        "id": state.model,
        "object": "model",
        "created": state.created,
        "owned_by": "tsl3",
        "max_model_len": state.limits.max_prompt_tokens as u64
            + u64::from(state.limits.max_output_tokens),
    })
}

pub async fn list(state: web::Data<FrontendState>) -> HttpResponse {
    HttpResponse::Ok().json(json!({"object": "list", "data": [model(&state)]}))
}

pub async fn retrieve(state: web::Data<FrontendState>, id: web::Path<String>) -> HttpResponse {
    if id.as_str() == state.model {
        HttpResponse::Ok().json(model(&state))
    } else {
        ApiError::model_not_found(&id).response()
    }
}
