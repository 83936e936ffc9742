//! Logging and OTLP tracing setup. Tracing export is off by default: with no endpoint (in
//! settings or the standard `OTEL_EXPORTER_OTLP_ENDPOINT`), no OpenTelemetry layer is
//! installed at all, so spans cost only the `tracing` crate's disabled-callsite check.
//! With an endpoint, spans go to an OTLP collector over gRPC (tonic) or HTTP (protobuf).
//! This module never decides anything about storage; it only exports.

use anyhow::{bail, Context, Result};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use std::io::IsTerminal;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// Where and how spans are exported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpTarget {
    pub endpoint: String,
    pub protocol: OtlpProtocol,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtlpProtocol {
    Grpc,
    Http,
}

/// Resolves the OTLP target: the settings' endpoint, else `OTEL_EXPORTER_OTLP_ENDPOINT`;
/// None when both are empty (export off).
pub fn resolve_target(
    endpoint: &str,
    protocol: &str,
    env_endpoint: Option<&str>,
) -> Result<Option<OtlpTarget>> {
    let endpoint = if endpoint.is_empty() {
        env_endpoint.unwrap_or("").to_string()
    } else {
        endpoint.to_string()
    };
    if endpoint.is_empty() {
        return Ok(None);
    }
    let protocol = match protocol {
        "grpc" => OtlpProtocol::Grpc,
        "http" => OtlpProtocol::Http,
        other => bail!("telemetry.otlp_protocol: must be grpc or http (got {other:?})"),
    };
    Ok(Some(OtlpTarget { endpoint, protocol }))
}

/// Builds a tracer provider exporting to `target`. Must be called inside a tokio runtime
/// (the gRPC channel is created on it).
pub fn provider(target: &OtlpTarget, service: &str, rank: u32) -> Result<SdkTracerProvider> {
    let exporter = match target.protocol {
        OtlpProtocol::Grpc => SpanExporter::builder()
            .with_tonic()
            .with_endpoint(target.endpoint.clone())
            .build()
            .context("building the OTLP gRPC exporter")?,
        OtlpProtocol::Http => SpanExporter::builder()
            .with_http()
            .with_endpoint(format!(
                "{}/v1/traces",
                target.endpoint.trim_end_matches('/')
            ))
            .build()
            .context("building the OTLP HTTP exporter")?,
    };
    let resource = Resource::builder()
        .with_service_name(service.to_string())
        .with_attribute(KeyValue::new("tp_rank", rank as i64))
        .build();
    // The batch processor runs its exports on the tokio runtime (both the gRPC channel and
    // the HTTP client need its reactor), never on the threads that emit spans.
    let processor =
        opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        )
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .build())
}

/// The OpenTelemetry layer for a provider (tests install it with a scoped subscriber).
pub fn otel_layer<S>(provider: &SdkTracerProvider) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("tsl3"))
}

/// Keeps the exporter alive; flushes and shuts it down on drop.
pub struct TelemetryGuard {
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.force_flush();
            let _ = p.shutdown();
        }
    }
}

/// The stderr log filter when RUST_LOG is unset: info, without the per-operation storage
/// lifecycle (with export on, that goes to the OTLP collector).
pub const DEFAULT_LOG_FILTER: &str = "info,actors::l3=warn,actors::scheduler=warn";

/// Installs the global subscriber: a stderr log layer and, when a target is set, the OTLP
/// layer. The filter is RUST_LOG (default [`DEFAULT_LOG_FILTER`]); with export on, tsl3's own
/// spans are always enabled on top of it, so export does not depend on RUST_LOG. With
/// export off and the default filter, the per-operation storage spans are disabled at their
/// callsites and cost only that check.
pub fn init(target: Option<OtlpTarget>, service: &str, rank: u32) -> Result<TelemetryGuard> {
    let mut filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER));
    // Colours only for a terminal (a file, a pipe or journald gets plain text), and never
    // with NO_COLOR set.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_target(false);
    match target {
        None => {
            Registry::default().with(filter).with(fmt).try_init().ok();
            Ok(TelemetryGuard { provider: None })
        }
        Some(t) => {
            for d in ["actors=info", "engine_host=info"] {
                if let Ok(d) = d.parse() {
                    filter = filter.add_directive(d);
                }
            }
            let p = provider(&t, service, rank)?;
            let otel = otel_layer(&p);
            Registry::default()
                .with(filter)
                .with(fmt)
                .with(otel)
                .try_init()
                .ok();
            Ok(TelemetryGuard { provider: Some(p) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_is_off_without_an_endpoint() {
        assert_eq!(resolve_target("", "grpc", None).unwrap(), None);
        assert_eq!(resolve_target("", "grpc", Some("")).unwrap(), None);
        let t = resolve_target("", "http", Some("http://127.0.0.1:4318"))
            .unwrap()
            .unwrap();
        assert_eq!(t.protocol, OtlpProtocol::Http);
        let t = resolve_target("http://x:4317", "grpc", Some("http://y"))
            .unwrap()
            .unwrap();
        assert_eq!(
            t.endpoint, "http://x:4317",
            "settings win over the environment"
        );
        assert!(resolve_target("http://x", "carrier", None).is_err());
    }
}
