//! Generates the messages of CRI's streaming list calls (proto/cri_list_streaming.proto)
//! with tonic-prost-build; the CRI messages they carry are k8s-cri's. No client or
//! server: plegd's client calls them through its raw codec (the responses are read
//! in place), and the simulator generates its own server from the same file.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/cri_list_streaming.proto");
    let mut config = tonic_prost_build::configure()
        .build_client(false)
        .build_server(false);
    for name in [
        "PodSandboxFilter",
        "PodSandbox",
        "ContainerFilter",
        "Container",
    ] {
        config = config.extern_path(
            format!(".runtime.v1.{name}"),
            format!("::k8s_cri::v1::{name}"),
        );
    }
    config.compile_protos(&["proto/cri_list_streaming.proto"], &["proto"])?;
    Ok(())
}
