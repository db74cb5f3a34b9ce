//! docker-compose.yml starts the workload with arguments its real flag parser accepts
//! (plegd's own deployment arguments are checked in plegd/tests/deploy_files.rs).

use std::path::Path;

use clap::Parser as _;
use plegd_workload::Args;
use yaml_rust2::YamlLoader;

#[test]
fn compose_gives_the_workload_arguments_it_accepts() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docker-compose.yml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let docs = YamlLoader::load_from_str(&text).expect("docker-compose.yml is YAML");
    let workload = &docs[0]["services"]["workload"];
    assert_eq!(workload["build"]["target"].as_str(), Some("workload"));
    let mut argv = vec!["plegd-workload".to_string()];
    for arg in workload["command"]
        .as_vec()
        .expect("services.workload.command is a list")
    {
        match arg {
            yaml_rust2::Yaml::String(s) | yaml_rust2::Yaml::Real(s) => argv.push(s.clone()),
            yaml_rust2::Yaml::Integer(i) => argv.push(i.to_string()),
            other => panic!("services.workload.command: {other:?} is not a scalar"),
        }
    }
    if let Err(e) = Args::try_parse_from(&argv) {
        panic!("docker-compose.yml: `{}` is refused:\n{e}", argv.join(" "));
    }
}
