//! The console's own style sheet and script, compiled into the binary and served from this origin:
//! the pages load nothing from anywhere else.

use actix_web::http::header;
use actix_web::{HttpResponse, web};

/// The style sheet.
const STYLE: &str = include_str!("../assets/console.css");

/// The script: refreshes the overview's figures, and nothing else.
const SCRIPT: &str = include_str!("../assets/console.js");

/// `GET /console/assets/{file}`.
pub(super) async fn serve(file: web::Path<String>) -> HttpResponse {
    let (body, content_type) = match file.as_str() {
        "console.css" => (STYLE, "text/css; charset=utf-8"),
        "console.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        _ => return super::pages::not_found().await,
    };
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, content_type))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(body)
}
