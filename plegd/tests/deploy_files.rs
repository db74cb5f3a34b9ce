//! The deployment files start plegd the way the real plegd accepts, and agree with
//! each other wherever plegd is concerned.
//!
//! Each file's plegd command line (deploy/daemonset.yaml, deploy/plegd.service,
//! docker-compose.yml, the Dockerfile's CMD), with the environment that file and the
//! image give it, is run through the built binary with `--print-config`: it must exit
//! 0, and the effective configuration it prints is what the cross-checks use — the
//! metrics port is the one probed, published, annotated and scraped, the runtime
//! socket plegd dials is the one mounted (and the one containerd and the workload
//! use), and the image builds plegd exactly as scripts/run.sh does, with the
//! toolchain of rust-toolchain.toml. Generic validity (schemas, compose's loader,
//! hadolint, systemd-analyze) is scripts/lint.sh's job.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use yaml_rust2::{Yaml, YamlLoader};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {rel}: {e}"))
}

fn yaml(rel: &str) -> Vec<Yaml> {
    YamlLoader::load_from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel} is not YAML: {e}"))
}

/// A scalar as a string (YAML numbers and booleans included).
fn scalar(y: &Yaml) -> Option<String> {
    match y {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A list of scalars; an absent key is an empty list.
fn strings(y: &Yaml, what: &str) -> Vec<String> {
    match y {
        Yaml::BadValue | Yaml::Null => Vec::new(),
        Yaml::Array(items) => items
            .iter()
            .map(|i| scalar(i).unwrap_or_else(|| panic!("{what}: {i:?} is not a scalar")))
            .collect(),
        other => panic!("{what}: expected a list, got {other:?}"),
    }
}

fn text(y: &Yaml, what: &str) -> String {
    scalar(y).unwrap_or_else(|| panic!("{what}: missing or not a scalar ({y:?})"))
}

/// How a deployment file starts plegd.
struct Launch {
    file: &'static str,
    args: Vec<String>,
    env: BTreeMap<String, String>,
}

/// The settings plegd derives from a launch (`--print-config`), which must succeed.
struct Effective {
    file: &'static str,
    config: toml::Table,
}

impl Launch {
    fn effective(&self) -> Effective {
        let out = Command::new(env!("CARGO_BIN_EXE_plegd"))
            .env_clear()
            .envs(&self.env)
            .args(&self.args)
            .arg("--print-config")
            .output()
            .expect("the plegd binary runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{}: plegd rejects `plegd {}` with environment {:?} ({}):\n{stderr}",
            self.file,
            self.args.join(" "),
            self.env,
            out.status
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let config = stdout.parse().unwrap_or_else(|e| {
            panic!(
                "{}: --print-config printed no TOML ({e}):\n{stdout}",
                self.file
            )
        });
        Effective {
            file: self.file,
            config,
        }
    }
}

impl Effective {
    /// A setting by its flag name, wherever the printed TOML puts it.
    fn get(&self, key: &str) -> String {
        fn find(t: &toml::Table, key: &str) -> Option<String> {
            for (k, v) in t {
                if k == key || *k == key.replace('-', "_") {
                    return Some(match v {
                        toml::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    });
                }
                if let toml::Value::Table(inner) = v {
                    if let Some(found) = find(inner, key) {
                        return Some(found);
                    }
                }
            }
            None
        }
        find(&self.config, key).unwrap_or_else(|| {
            panic!(
                "{}: --print-config shows no {key}:\n{}",
                self.file, self.config
            )
        })
    }

    /// The socket path of `runtime-endpoint` (unix:///path).
    fn socket(&self) -> String {
        let endpoint = self.get("runtime-endpoint");
        match endpoint.strip_prefix("unix://") {
            Some(path) => path.to_string(),
            None => panic!("{}: runtime endpoint {endpoint} is not unix://", self.file),
        }
    }

    /// (host, port) of `metrics-addr`.
    fn metrics(&self) -> (String, u16) {
        let addr = self.get("metrics-addr");
        let (host, port) = addr
            .rsplit_once(':')
            .unwrap_or_else(|| panic!("{}: metrics address {addr} has no port", self.file));
        let port = port
            .parse()
            .unwrap_or_else(|e| panic!("{}: metrics port in {addr}: {e}", self.file));
        (host.to_string(), port)
    }
}

/// The container `c`'s volumeMount holding `path` and the pod's volume it mounts.
fn mounted<'a>(pod: &'a Yaml, c: &'a Yaml, path: &str, what: &str) -> (&'a Yaml, &'a Yaml) {
    let mount = c["volumeMounts"]
        .as_vec()
        .into_iter()
        .flatten()
        .find(|m| m["mountPath"].as_str().is_some_and(|p| under(path, p)))
        .unwrap_or_else(|| panic!("no volumeMount holds {what} {path}"));
    let volume = pod["spec"]["volumes"]
        .as_vec()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == mount["name"])
        .unwrap_or_else(|| panic!("volumeMount {:?} has no volume", mount["name"]));
    (mount, volume)
}

/// Whether `path` is `dir` or inside it.
fn under(path: &str, dir: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    path == dir || path.starts_with(&format!("{dir}/"))
}

// ---------------------------------------------------------------- Dockerfile

/// One Dockerfile instruction: stage index, keyword (upper case), arguments.
struct Instruction {
    stage: usize,
    keyword: String,
    args: String,
}

/// Instructions with continuation lines joined and comments dropped.
fn dockerfile() -> Vec<Instruction> {
    let mut out: Vec<Instruction> = Vec::new();
    let mut current = String::new();
    let mut stage = 0;
    for line in read("Dockerfile").lines() {
        let line = line.trim();
        if line.starts_with('#') || (current.is_empty() && line.is_empty()) {
            continue;
        }
        if let Some(head) = line.strip_suffix('\\') {
            current.push_str(head);
            current.push(' ');
            continue;
        }
        current.push_str(line);
        let (keyword, args) = current.split_once(' ').unwrap_or((&current, ""));
        let keyword = keyword.to_uppercase();
        if keyword == "FROM" && !out.is_empty() {
            stage += 1;
        }
        out.push(Instruction {
            stage,
            keyword,
            args: args.trim().to_string(),
        });
        current.clear();
    }
    out
}

/// The image plegd runs in: the Dockerfile's last stage.
struct Image {
    entrypoint: Vec<String>,
    cmd: Vec<String>,
    env: BTreeMap<String, String>,
    expose: Vec<String>,
    name: String,
}

fn json_list(args: &str, what: &str) -> Vec<String> {
    serde_json::from_str(args)
        .unwrap_or_else(|e| panic!("Dockerfile {what} must be a JSON list ({e}): {args}"))
}

fn image() -> Image {
    let all = dockerfile();
    let last = all.iter().map(|i| i.stage).max().unwrap_or(0);
    let mut image = Image {
        entrypoint: Vec::new(),
        cmd: Vec::new(),
        env: BTreeMap::new(),
        expose: Vec::new(),
        name: String::new(),
    };
    for i in all.iter().filter(|i| i.stage == last) {
        match i.keyword.as_str() {
            "FROM" => {
                image.name = i.args.split_whitespace().nth(2).unwrap_or("").to_string();
            }
            "ENTRYPOINT" => image.entrypoint = json_list(&i.args, "ENTRYPOINT"),
            "CMD" => image.cmd = json_list(&i.args, "CMD"),
            "EXPOSE" => image
                .expose
                .extend(i.args.split_whitespace().map(str::to_string)),
            "ENV" => {
                for pair in i.args.split_whitespace() {
                    let (k, v) = pair
                        .split_once('=')
                        .unwrap_or_else(|| panic!("Dockerfile ENV {pair}: use the KEY=VALUE form"));
                    assert!(
                        !v.contains(['"', '\'', '$']),
                        "Dockerfile ENV {pair}: keep values plain"
                    );
                    image.env.insert(k.to_string(), v.to_string());
                }
            }
            _ => {}
        }
    }
    assert_eq!(
        image.entrypoint,
        ["plegd"],
        "the Dockerfile's last stage must be plegd's image"
    );
    image
}

/// Every `cargo build ...` command in a text, redirections dropped, spaces collapsed.
fn cargo_builds(text: &str) -> Vec<String> {
    let joined = text.replace("\\\n", " ");
    joined
        .lines()
        .filter_map(|l| l.find("cargo build").map(|at| &l[at..]))
        .map(|c| {
            c.split(['&', ';', '|'])
                .next()
                .unwrap_or("")
                .split_whitespace()
                .filter(|w| !w.starts_with('>') && !w.starts_with("2>"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[test]
fn the_image_runs_plegd_with_arguments_it_accepts() {
    let image = image();
    let effective = Launch {
        file: "Dockerfile (CMD)",
        args: image.cmd.clone(),
        env: image.env.clone(),
    }
    .effective();
    let (_, port) = effective.metrics();
    assert!(
        image.expose.contains(&port.to_string()),
        "the Dockerfile EXPOSEs {:?}, plegd serves metrics on {port}",
        image.expose
    );
}

#[test]
fn the_image_builds_plegd_as_run_sh_does_with_the_pinned_toolchain_and_glibc() {
    let run_sh = cargo_builds(&read("scripts/run.sh"));
    assert_eq!(
        run_sh.len(),
        1,
        "scripts/run.sh: expected one cargo build, found {run_sh:?}"
    );
    let docker = cargo_builds(&read("Dockerfile"));
    assert!(
        docker.contains(&run_sh[0]),
        "the Dockerfile builds with {docker:?}, scripts/run.sh with {:?}",
        run_sh[0]
    );

    // plegd links the builder's glibc: the image must be of the same Debian release.
    let froms: Vec<String> = dockerfile()
        .into_iter()
        .filter(|i| i.keyword == "FROM")
        .map(|i| i.args)
        .collect();
    let release = |from: &str| {
        ["bookworm", "trixie", "bullseye", "forky"]
            .into_iter()
            .find(|r| from.split_whitespace().next().unwrap_or("").contains(r))
            .unwrap_or_else(|| panic!("Dockerfile FROM {from}: name the Debian release"))
    };
    let image_from = froms.last().expect("the Dockerfile has stages");
    for from in froms.iter().filter(|f| f.starts_with("rust:")) {
        assert_eq!(
            release(from),
            release(image_from),
            "plegd is built FROM {from} but runs FROM {image_from}"
        );
    }

    let toolchain: toml::Table = read("rust-toolchain.toml")
        .parse()
        .unwrap_or_else(|e| panic!("rust-toolchain.toml: {e}"));
    let channel = toolchain
        .get("toolchain")
        .and_then(|t| t.get("channel"))
        .and_then(|c| c.as_str())
        .expect("rust-toolchain.toml names a channel");
    let rust_images: Vec<String> = dockerfile()
        .into_iter()
        .filter(|i| i.keyword == "FROM" && i.args.starts_with("rust:"))
        .map(|i| i.args)
        .collect();
    assert!(
        !rust_images.is_empty(),
        "the Dockerfile builds FROM no rust: image"
    );
    for from in rust_images {
        assert!(
            from.starts_with(&format!("rust:{channel}-")),
            "Dockerfile FROM {from}: rust-toolchain.toml pins {channel}"
        );
    }
}

// ---------------------------------------------------------------- docker-compose.yml

#[test]
fn compose_runs_plegd_wired_to_containerd_the_workload_and_the_collector() {
    let docs = yaml("docker-compose.yml");
    let compose = &docs[0];
    let services = &compose["services"];
    let plegd = &services["plegd"];
    assert_eq!(
        text(&plegd["build"]["target"], "services.plegd.build.target"),
        image().name,
        "compose must build plegd from the Dockerfile's plegd stage"
    );
    let mut env = image().env;
    if let Some(vars) = plegd["environment"].as_hash() {
        for (k, v) in vars {
            env.insert(text(k, "environment key"), text(v, "environment value"));
        }
    }
    let effective = Launch {
        file: "docker-compose.yml (plegd)",
        args: strings(&plegd["command"], "services.plegd.command"),
        env,
    }
    .effective();

    // Metrics: published, and what the healthcheck probes.
    let (_, port) = effective.metrics();
    let published: Vec<String> = strings(&plegd["ports"], "services.plegd.ports")
        .iter()
        .map(|p| {
            p.split('/')
                .next()
                .unwrap_or("")
                .rsplit(':')
                .next()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert!(
        published.contains(&port.to_string()),
        "plegd serves metrics on {port}, compose publishes {published:?}"
    );
    let probe = strings(
        &plegd["healthcheck"]["test"],
        "services.plegd.healthcheck.test",
    )
    .join(" ");
    assert!(
        probe.contains(&port.to_string()),
        "the plegd healthcheck does not probe port {port}: {probe}"
    );

    // The runtime socket: in a named volume that containerd mounts at the same place,
    // where containerd's config puts its socket, and which the workload dials too.
    let socket = effective.socket();
    let mount = |service: &Yaml, name: &str| -> Option<(String, String)> {
        strings(&service["volumes"], &format!("services.{name}.volumes"))
            .iter()
            .filter_map(|v| {
                let mut parts = v.split(':');
                Some((parts.next()?.to_string(), parts.next()?.to_string()))
            })
            .find(|(_, target)| under(&socket, target))
    };
    let (volume, target) = mount(plegd, "plegd")
        .unwrap_or_else(|| panic!("compose mounts nothing over plegd's socket {socket}"));
    assert!(
        compose["volumes"][volume.as_str()] != Yaml::BadValue,
        "plegd's socket comes from {volume}, which is not a named volume"
    );
    for name in ["containerd", "workload"] {
        assert_eq!(
            mount(&services[name], name),
            Some((volume.clone(), target.clone())),
            "{name} must mount volume {volume} at {target}, as plegd does"
        );
    }
    let containerd: toml::Table = read("compose/containerd-config.toml")
        .parse()
        .unwrap_or_else(|e| panic!("compose/containerd-config.toml: {e}"));
    let grpc = containerd
        .get("grpc")
        .and_then(|g| g.get("address"))
        .and_then(|a| a.as_str());
    assert_eq!(
        grpc,
        Some(socket.as_str()),
        "containerd's [grpc] address is not plegd's socket"
    );
    let workload = strings(
        &services["workload"]["command"],
        "services.workload.command",
    );
    let endpoint = workload
        .iter()
        .position(|a| a == "--runtime-endpoint")
        .and_then(|i| workload.get(i + 1));
    assert_eq!(
        endpoint.map(String::as_str),
        Some(effective.get("runtime-endpoint").as_str()),
        "the workload must dial plegd's runtime endpoint"
    );

    // The collector: plegd's OTLP endpoint names it, and it scrapes plegd's port.
    let otlp = effective.get("otlp-endpoint");
    let host = otlp
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .split(':')
        .next()
        .unwrap_or("");
    assert!(
        services[host] != Yaml::BadValue,
        "plegd's OTLP endpoint {otlp} names no service"
    );
    let collector = yaml("compose/otel-collector.yaml");
    let scrape = &collector[0]["receivers"]["prometheus"]["config"]["scrape_configs"];
    let targets: Vec<String> = scrape
        .as_vec()
        .into_iter()
        .flatten()
        .flat_map(|job| job["static_configs"].as_vec().into_iter().flatten())
        .flat_map(|c| strings(&c["targets"], "scrape targets"))
        .filter(|t| t.starts_with("plegd:"))
        .collect();
    assert_eq!(
        targets,
        [format!("plegd:{port}")],
        "the collector must scrape plegd's metrics port"
    );

    // The lifecycle events go there too, as log records, shown and kept in a file.
    assert_eq!(
        effective.get("otlp-events"),
        "true",
        "compose runs --otlp-events"
    );
    check_collector_config("compose/otel-collector.yaml", &collector[0], CORE);
    let logs = &collector[0]["service"]["pipelines"]["logs"];
    assert!(strings(&logs["receivers"], "logs receivers").contains(&"otlp".to_string()));
    let exporters = strings(&logs["exporters"], "logs exporters");
    assert!(
        exporters.iter().any(|e| e == "debug") && exporters.iter().any(|e| e.starts_with("file")),
        "the demo's collector must print the event records and write them to a file: {exporters:?}"
    );
}

// ---------------------------------------------------------------- collector configs

/// Component types of the core collector image (otel/opentelemetry-collector) used here.
const CORE: &[&str] = &[
    "otlp",
    "prometheus",
    "batch",
    "memory_limiter",
    "debug",
    "file",
    "health_check",
];
/// ... and of the contrib image, for the gateway.
const CONTRIB: &[&str] = &[
    "otlp",
    "batch",
    "memory_limiter",
    "health_check",
    "transform",
    "resource",
    "groupbyattrs",
    "kafka",
];

/// A collector configuration is complete: every component a pipeline names is
/// defined, every defined one is used, and each is of a type its image has.
fn check_collector_config(file: &str, config: &Yaml, image_has: &[&str]) {
    let pipelines = config["service"]["pipelines"]
        .as_hash()
        .unwrap_or_else(|| panic!("{file}: no service.pipelines"));
    let mut kinds = vec![(
        "extensions",
        strings(&config["service"]["extensions"], "service.extensions"),
    )];
    for kind in ["receivers", "processors", "exporters"] {
        let used: Vec<String> = pipelines
            .values()
            .flat_map(|p| strings(&p[kind], &format!("{file}: pipeline {kind}")))
            .collect();
        kinds.push((kind, used));
    }
    for (kind, used) in kinds {
        let defined: Vec<String> = config[kind]
            .as_hash()
            .into_iter()
            .flatten()
            .map(|(k, _)| text(k, kind))
            .collect();
        for name in &used {
            assert!(
                defined.contains(name),
                "{file}: {kind} {name} is used but not defined"
            );
        }
        for name in &defined {
            assert!(
                used.contains(name),
                "{file}: {kind} {name} is defined but never used"
            );
            let ty = name.split('/').next().unwrap_or("");
            assert!(
                image_has.contains(&ty),
                "{file}: {kind} {name}: type {ty} is not in its image"
            );
        }
    }
}

fn manifest<'a>(docs: &'a [Yaml], kind: &str, name: &str) -> &'a Yaml {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("deploy/collector/collector.yaml has no {kind} {name}"))
}

/// `host:port` of a Service (`name.namespace.svc`) and its port.
fn service_address(svc: &Yaml) -> String {
    format!(
        "{}.{}.svc:{}",
        text(&svc["metadata"]["name"], "service name"),
        text(&svc["metadata"]["namespace"], "service namespace"),
        text(&svc["spec"]["ports"][0]["port"], "service port"),
    )
}

#[test]
fn the_collector_pipeline_is_complete_keeps_per_pod_order_and_keys_kafka_by_pod() {
    let docs = yaml("deploy/collector/collector.yaml");
    let kustomization = &yaml("deploy/collector/kustomization.yaml")[0];
    let agent_svc = manifest(&docs, "Service", "otel-agent");
    assert_eq!(
        agent_svc["spec"]["internalTrafficPolicy"].as_str(),
        Some("Local"),
        "each plegd must reach the agent of its own node"
    );
    let gateway_svc = manifest(&docs, "Service", "otel-gateway");
    let mut configs = BTreeMap::new();
    for (kind, name, file, image_has) in [
        ("DaemonSet", "otel-agent", "agent.yaml", CORE),
        ("Deployment", "otel-gateway", "gateway.yaml", CONTRIB),
    ] {
        let pod = &manifest(&docs, kind, name)["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        // The config file comes from the ConfigMap kustomize makes of it.
        let map = kustomization["configMapGenerator"]
            .as_vec()
            .into_iter()
            .flatten()
            .find(|g| strings(&g["files"], "files").contains(&file.to_string()))
            .unwrap_or_else(|| panic!("kustomization.yaml makes no ConfigMap of {file}"));
        let volume = pod["volumes"]
            .as_vec()
            .into_iter()
            .flatten()
            .find(|v| v["configMap"]["name"] == map["name"])
            .unwrap_or_else(|| panic!("{name} mounts no ConfigMap {:?}", map["name"]));
        let mount = c["volumeMounts"]
            .as_vec()
            .into_iter()
            .flatten()
            .find(|m| m["name"] == volume["name"])
            .unwrap_or_else(|| panic!("{name}: the config volume is not mounted"));
        let path = format!("{}/{file}", text(&mount["mountPath"], "mountPath"));
        assert!(
            strings(&c["args"], "args").contains(&format!("--config={path}")),
            "{name} must run with --config={path}"
        );
        let image = text(&c["image"], "image");
        let want_image = if image_has == CORE {
            "otel/opentelemetry-collector:"
        } else {
            "otel/opentelemetry-collector-contrib:"
        };
        assert!(image.starts_with(want_image), "{name}: image {image}");
        let config = yaml(&format!("deploy/collector/{file}")).remove(0);
        check_collector_config(file, &config, image_has);
        // Its OTLP receiver listens on the port its Service sends to.
        let svc = if name == "otel-agent" {
            agent_svc
        } else {
            gateway_svc
        };
        let port = text(&svc["spec"]["ports"][0]["port"], "port");
        let listen = text(
            &config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"],
            "otlp endpoint",
        );
        assert!(
            listen.ends_with(&format!(":{port}")),
            "{file}: listens on {listen}, the Service sends to {port}"
        );
        configs.insert(name, config);
    }
    let agent = &configs["otel-agent"];
    let gateway = &configs["otel-gateway"];

    // plegd → agent → gateway, one consumer per queue so batches keep their order.
    let to_gateway = &agent["exporters"]["otlp/gateway"];
    assert_eq!(
        text(&to_gateway["endpoint"], "agent exporter"),
        service_address(gateway_svc)
    );
    let kafka = &gateway["exporters"]["kafka"];
    for (file, exporter) in [("agent.yaml", to_gateway), ("gateway.yaml", kafka)] {
        assert_eq!(
            exporter["sending_queue"]["num_consumers"].as_i64(),
            Some(1),
            "{file}: several consumers would reorder a pod's records"
        );
    }
    // Kafka keyed by pod: the records are grouped by pod UID last, and the key is
    // the resource.
    let processors = strings(
        &gateway["service"]["pipelines"]["logs"]["processors"],
        "processors",
    );
    let last = processors.last().expect("the gateway has processors");
    assert!(
        last.starts_with("groupbyattrs"),
        "the gateway must group by pod last: {processors:?}"
    );
    assert_eq!(
        strings(&gateway["processors"][last.as_str()]["keys"], "keys"),
        ["k8s.pod.uid"]
    );
    assert_eq!(
        kafka["partition_logs_by_resource_attributes"].as_bool(),
        Some(true)
    );
    assert_eq!(
        manifest(&docs, "Deployment", "otel-gateway")["spec"]["replicas"].as_i64(),
        Some(1)
    );
}

// ---------------------------------------------------------------- deploy/daemonset.yaml

#[test]
fn the_daemonset_runs_plegd_with_its_probes_port_and_socket_wired() {
    let docs = yaml("deploy/daemonset.yaml");
    let ds = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("DaemonSet"))
        .expect("deploy/daemonset.yaml has a DaemonSet");
    let pod = &ds["spec"]["template"];
    let containers = pod["spec"]["containers"]
        .as_vec()
        .expect("the DaemonSet has containers");
    let c = containers
        .iter()
        .find(|c| c["name"].as_str() == Some("plegd"))
        .expect("the DaemonSet has a container named plegd");
    let mut args = strings(&c["command"], "command");
    assert!(
        args.is_empty(),
        "the plegd container keeps the image's ENTRYPOINT (no command:), got {args:?}"
    );
    args.extend(strings(&c["args"], "args"));
    let mut env = image().env;
    for e in c["env"].as_vec().into_iter().flatten() {
        let name = text(&e["name"], "env name");
        // The downward API fills spec.nodeName in at run time: any node name will do.
        let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
            Some("spec.nodeName") => "node-1".to_string(),
            Some(other) => panic!("env {name}: unexpected fieldRef {other}"),
            None => text(&e["value"], "env value"),
        };
        env.insert(name, value);
    }
    let effective = Launch {
        file: "deploy/daemonset.yaml",
        args,
        env,
    }
    .effective();

    // The events go to the node's collector agent (deploy/collector).
    assert_eq!(
        effective.get("otlp-events"),
        "true",
        "the DaemonSet runs --otlp-events"
    );
    let collector = yaml("deploy/collector/collector.yaml");
    let agent = collector
        .iter()
        .find(|d| {
            d["kind"].as_str() == Some("Service")
                && d["metadata"]["name"].as_str() == Some("otel-agent")
        })
        .expect("deploy/collector/collector.yaml has the Service otel-agent");
    assert_eq!(
        effective.get("otlp-events-endpoint"),
        format!("http://{}", service_address(agent)),
        "plegd must send its events to the agent's Service"
    );

    let (host, port) = effective.metrics();
    assert!(
        !["127.0.0.1", "localhost", "[::1]"].contains(&host.as_str()),
        "metrics on {host}: the kubelet's probes and Prometheus cannot reach loopback"
    );
    let ports: Vec<(String, String)> = c["ports"]
        .as_vec()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                scalar(&p["name"]).unwrap_or_default(),
                text(&p["containerPort"], "containerPort"),
            )
        })
        .collect();
    assert!(
        ports.iter().any(|(_, p)| *p == port.to_string()),
        "no containerPort {port} in {ports:?}"
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"].as_str(), Some(path), "{probe} path");
        let probed = text(&get["port"], "probe port");
        let probed = ports
            .iter()
            .find(|(name, _)| *name == probed)
            .map_or(probed.clone(), |(_, number)| number.clone());
        assert_eq!(probed, port.to_string(), "{probe} port");
    }
    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"].as_str(), Some("true"));
    assert_eq!(
        annotations["prometheus.io/port"].as_str(),
        Some(port.to_string().as_str()),
        "prometheus.io/port annotation"
    );

    // uid 0 is what lets plegd connect to the runtime's root:root 0660 socket.
    let security = &c["securityContext"];
    assert_eq!(
        security["runAsUser"].as_i64(),
        Some(0),
        "plegd must run as uid 0"
    );
    assert_ne!(
        security["runAsNonRoot"].as_bool(),
        Some(true),
        "plegd must run as uid 0"
    );

    // The socket plegd dials is the node's: a hostPath mounted at its own path.
    let socket = effective.socket();
    let (mount, volume) = mounted(pod, c, &socket, "the runtime socket");
    assert_eq!(
        volume["hostPath"]["path"].as_str(),
        mount["mountPath"].as_str(),
        "the socket's hostPath must be mounted at the same path, or the endpoint differs on the node"
    );

    // The state dir outlives the pod (a rollout goes on where the last pod stopped):
    // a writable hostPath, never the read-only root or an emptyDir.
    let state = effective.get("state-dir");
    let (mount, volume) = mounted(pod, c, &state, "the state dir");
    assert_ne!(
        mount["readOnly"].as_bool(),
        Some(true),
        "the state dir must be writable"
    );
    assert!(
        volume["hostPath"]["path"].as_str().is_some(),
        "the state dir must be a hostPath, or it goes with the pod: {volume:?}"
    );
}

// ---------------------------------------------------------------- deploy/plegd.service

#[test]
fn the_systemd_unit_runs_plegd_with_arguments_it_accepts() {
    let unit = read("deploy/plegd.service");
    let mut exec = None;
    let mut env = BTreeMap::new();
    let mut section = "";
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[Service]" {
            if let Some(cmd) = line.strip_prefix("ExecStart=") {
                exec = Some(cmd.to_string());
            } else if let Some(vars) = line.strip_prefix("Environment=") {
                for pair in vars.split_whitespace() {
                    let (k, v) = pair.split_once('=').expect("Environment=KEY=VALUE");
                    env.insert(k.to_string(), v.to_string());
                }
            }
        }
    }
    let exec = exec.expect("deploy/plegd.service has an ExecStart=");
    assert!(
        !exec.contains(['"', '\'', '\\', '$', '%']),
        "keep ExecStart a plain line (no quoting, variables or specifiers): {exec}"
    );
    let mut words = exec.split_whitespace().map(str::to_string);
    assert_eq!(
        words.next().as_deref(),
        Some("/usr/local/bin/plegd"),
        "ExecStart runs plegd where docs/deploy.md installs it"
    );
    let effective = Launch {
        file: "deploy/plegd.service",
        args: words.collect(),
        env,
    }
    .effective();
    effective.socket();
    // ProtectSystem=strict leaves only the unit's own directories writable: the state
    // dir must be its StateDirectory (systemd makes it, 0700, kept across restarts).
    let state_directory = unit
        .lines()
        .find_map(|l| l.trim().strip_prefix("StateDirectory="))
        .expect("deploy/plegd.service has a StateDirectory=");
    assert_eq!(
        effective.get("state-dir"),
        format!("/var/lib/{state_directory}"),
        "--state-dir must be the unit's StateDirectory"
    );
}
