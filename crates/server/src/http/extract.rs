//! Axum's `Path` and `Query`, refusing as the APIs refuse: a JSON
//! [`ApiError`] with a stable code (`invalid_path`, `invalid_query`), not
//! axum's plain-text rejection, so every 4xx of the documented APIs has the
//! body the OpenAPI document promises.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::http::error::ApiError;

/// The path's parameters, or 400 `invalid_path`.
pub struct Path<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Path<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Path<T>, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| Path(value))
            .map_err(|rejection| ApiError::bad_request("invalid_path", rejection.body_text()))
    }
}

/// The query string's parameters, or 400 `invalid_query` (a parameter
/// given twice, say).
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Query<T>, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(value)| Query(value))
            .map_err(|rejection| ApiError::bad_request("invalid_query", rejection.body_text()))
    }
}

/// A numeric id in the path (`what`: job, runner…), or 400 `invalid_path`.
pub fn path_id(id: &str, what: &str) -> Result<i64, ApiError> {
    id.parse::<i64>()
        .map_err(|_| ApiError::bad_request("invalid_path", format!("{id:?} is not a {what} id")))
}

/// A listing's `cursor=` (the `next_cursor` of the page before), or 400
/// `invalid_query`.
pub fn cursor(written: Option<&str>) -> Result<Option<i64>, ApiError> {
    written
        .map(|text| {
            text.parse::<i64>().map_err(|_| {
                ApiError::bad_request(
                    "invalid_query",
                    format!("cursor: {text:?} is not a cursor this API gave out"),
                )
            })
        })
        .transpose()
}

/// An optional JSON body: empty or `null` is `T::default()`, anything else
/// must parse (400 `invalid_body`).
pub fn optional_json<T: DeserializeOwned + Default>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let parsed: Option<T> = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request("invalid_body", format!("body: {e}")))?;
    Ok(parsed.unwrap_or_default())
}

/// Whole JSON numbers (`3`, and `3.0` too: JSON Schema's `integer` is a
/// value, not a spelling) for `#[serde(default, deserialize_with = …)]`.
pub mod whole {
    use serde::de::Error;
    use serde::{Deserialize, Deserializer};

    fn whole(number: &serde_json::Number) -> Option<f64> {
        number.as_f64().filter(|f| f.fract() == 0.0)
    }

    pub fn option_u64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        let Some(number) = Option::<serde_json::Number>::deserialize(d)? else {
            return Ok(None);
        };
        number
            .as_u64()
            .or_else(|| {
                whole(&number)
                    .filter(|f| *f >= 0.0 && *f < u64::MAX as f64)
                    .map(|f| f as u64)
            })
            .map(Some)
            .ok_or_else(|| {
                D::Error::custom(format!("{number} is not a whole number of at least 0"))
            })
    }

    pub fn option_i64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        let Some(number) = Option::<serde_json::Number>::deserialize(d)? else {
            return Ok(None);
        };
        number
            .as_i64()
            .or_else(|| {
                whole(&number)
                    .filter(|f| *f >= i64::MIN as f64 && *f < i64::MAX as f64)
                    .map(|f| f as i64)
            })
            .map(Some)
            .ok_or_else(|| D::Error::custom(format!("{number} is not a whole number")))
    }
}
