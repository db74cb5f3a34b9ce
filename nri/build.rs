//! Generates the NRI messages (prost) and ttRPC service bindings (async) from the
//! upstream API definition in `proto/nri/api.proto`. Needs `protoc`, like the CRI
//! bindings (scripts/test.sh installs Debian's `protobuf-compiler`).

use std::path::PathBuf;

use ttrpc_codegen_prost::{Codegen, Customize};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/nri/api.proto");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    Codegen::new()
        .out_dir(&out_dir)
        .input("proto/nri/api.proto")
        .include("proto")
        .prost()
        .customize(Customize {
            gen_mod: true,
            async_all: true,
            ..Default::default()
        })
        .run()?;
    Ok(())
}
