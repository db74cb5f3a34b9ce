//! Generates the plegd.v1 bindings with tonic-prost-build. It runs `protoc`, which the
//! build needs anyway for the CRI bindings (k8s-cri); `scripts/setup.sh` installs it.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/plegd/v1/plegd.proto");
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/plegd/v1/plegd.proto"], &["proto"])?;
    Ok(())
}
