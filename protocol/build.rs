//! Generates the plegd.v1 bindings with tonic-prost-build. It runs `protoc`, which the
//! build needs anyway for the CRI bindings (k8s-cri); `scripts/setup.sh` installs it.
//! It also writes the encoded file descriptor set (`plegd_v1_descriptor.bin` in
//! OUT_DIR), which the API server's reflection service serves.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/plegd/v1/plegd.proto");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("plegd_v1_descriptor.bin"))
        .build_server(true)
        .build_client(true)
        .compile_protos(&["proto/plegd/v1/plegd.proto"], &["proto"])?;
    Ok(())
}
