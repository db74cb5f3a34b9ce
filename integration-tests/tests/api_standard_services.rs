//! The standard gRPC services on the API socket, through tonic's clients for them:
//! grpc.health.v1 (SERVING once plegd is ready, for "" and plegd.v1.Plegd; NOT_FOUND
//! for another service) and server reflection v1 (the services listed, plegd.v1's
//! descriptor served).

use std::time::Duration;

use integration_tests::api::Served;
use integration_tests::wait::TIMEOUT;
use prost::Message as _;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::ServerReflectionRequest;

async fn channel(served: &Served) -> Channel {
    let socket = served.socket.clone();
    Endpoint::from_static("http://plegd.local")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                tokio::net::UnixStream::connect(socket)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .expect("the API server answers")
}

async fn status(health: &mut HealthClient<Channel>, service: &str) -> Result<i32, tonic::Status> {
    let req = HealthCheckRequest {
        service: service.into(),
    };
    Ok(health.check(req).await?.into_inner().status)
}

#[actix_rt::test]
async fn health_is_serving_once_ready_and_knows_plegd_v1() {
    let served = Served::start(Duration::from_millis(50), 64);
    let mut health = HealthClient::new(channel(&served).await);
    let serving = i32::from(ServingStatus::Serving);
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while status(&mut health, "").await.expect("health answers") != serving {
        assert!(
            tokio::time::Instant::now() < deadline,
            "health not SERVING within {TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served.pleg.health().ready());
    assert_eq!(
        status(&mut health, "plegd.v1.Plegd").await.unwrap(),
        serving
    );
    let unknown = status(&mut health, "no.such.Service").await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
}

async fn reflect(
    client: &mut ServerReflectionClient<Channel>,
    req: MessageRequest,
) -> MessageResponse {
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(req),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .expect("reflection answers")
        .into_inner();
    answers
        .message()
        .await
        .expect("a reflection answer")
        .and_then(|a| a.message_response)
        .expect("a message response")
}

#[actix_rt::test]
async fn reflection_lists_the_services_and_serves_plegd_v1() {
    let served = Served::start(Duration::from_millis(50), 64);
    let mut client = ServerReflectionClient::new(channel(&served).await);
    let MessageResponse::ListServicesResponse(list) =
        reflect(&mut client, MessageRequest::ListServices(String::new())).await
    else {
        panic!("not a service list");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    for want in [
        "plegd.v1.Plegd",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(names.contains(&want), "{want} in {names:?}");
    }
    let MessageResponse::FileDescriptorResponse(files) = reflect(
        &mut client,
        MessageRequest::FileContainingSymbol("plegd.v1.Plegd".into()),
    )
    .await
    else {
        panic!("not a file descriptor");
    };
    let file = prost_types::FileDescriptorProto::decode(files.file_descriptor_proto[0].as_slice())
        .expect("a FileDescriptorProto");
    assert_eq!(file.package(), "plegd.v1");
    let methods: Vec<_> = file.service[0].method.iter().map(|m| m.name()).collect();
    assert!(methods.contains(&"Watch"), "{methods:?}");
}
