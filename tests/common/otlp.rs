//! In-test OTLP receivers: a gRPC TraceService and a protobuf-over-HTTP `/v1/traces`
//! endpoint, each collecting every export request it receives.

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use std::sync::{Arc, Mutex};

pub type Received = Arc<Mutex<Vec<ExportTraceServiceRequest>>>;

#[derive(Clone, Default)]
pub struct Sink(Received);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// A gRPC receiver on `rt`: (endpoint, what it received).
pub fn grpc_receiver(rt: &tokio::runtime::Runtime) -> (String, Received) {
    let sink = Sink::default();
    let got = sink.0.clone();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(sink))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    (format!("http://{addr}"), got)
}

/// An HTTP receiver on its own actix system thread: (endpoint, received, its handle).
pub fn http_receiver() -> (String, Received, actix_web::dev::ServerHandle) {
    use actix_web::{web, App, HttpResponse, HttpServer};
    let got: Received = Arc::default();
    let g2 = got.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let sys = actix_web::rt::System::new();
        sys.block_on(async move {
            let server = HttpServer::new(move || {
                let g = g2.clone();
                App::new().route(
                    "/v1/traces",
                    web::post().to(move |body: web::Bytes| {
                        let g = g.clone();
                        async move {
                            match ExportTraceServiceRequest::decode(body) {
                                Ok(r) => {
                                    g.lock().unwrap().push(r);
                                    HttpResponse::Ok()
                                        .content_type("application/x-protobuf")
                                        .body(
                                            ExportTraceServiceResponse {
                                                partial_success: None,
                                            }
                                            .encode_to_vec(),
                                        )
                                }
                                Err(_) => HttpResponse::BadRequest().finish(),
                            }
                        }
                    }),
                )
            })
            .workers(1)
            .bind("127.0.0.1:0")
            .unwrap();
            let addr = server.addrs()[0];
            let running = server.run();
            tx.send((addr, running.handle())).unwrap();
            running.await.unwrap();
        });
    });
    let (addr, handle) = rx.recv().unwrap();
    (format!("http://{addr}"), got, handle)
}
