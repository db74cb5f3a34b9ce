//! Generates the server side of containerd's event service (sim/proto) for the
//! simulated runtime; its messages are the `containerd-client` crate's, re-exported
//! by plegd-runtime. Also the server side of CRI's streaming list calls, from
//! plegd-runtime's proto of them (its messages are plegd-runtime's).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    tonic_prost_build::configure()
        .build_client(false)
        .build_transport(false)
        .extern_path(
            ".containerd.types",
            "::plegd_runtime::containerd_events::containerd_types",
        )
        .extern_path(
            ".containerd.services.events.v1",
            "::plegd_runtime::containerd_events::containerd_services",
        )
        .compile_protos(&["proto/containerd_events.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=../runtime/proto/cri_list_streaming.proto");
    tonic_prost_build::configure()
        .build_client(false)
        .build_transport(false)
        .extern_path(".runtime.v1", "::plegd_runtime::list_streaming::proto")
        .compile_protos(
            &["../runtime/proto/cri_list_streaming.proto"],
            &["../runtime/proto"],
        )?;
    Ok(())
}
