//! A realistic node: what containerd and kubelet put on the objects of a real one.
//! containerd names sandboxes and containers with 64 hex digits; kubelet gives every
//! sandbox the pod's own labels and annotations plus its own `io.kubernetes.pod.*`
//! labels, and every container its `io.kubernetes.*` labels and annotations
//! (kubernetes `pkg/kubelet/kuberuntime/labels.go`). All of it arrives in every list,
//! status and event a runtime sends, so a benchmark on a node without it measures
//! less than a real node costs.
//!
//! The values are those of an ordinary Deployment's pod (`app`, `pod-template-hash`;
//! `kubernetes.io/config.seen` and `config.source`, which kubelet adds to every pod it
//! admits; a 30 s grace period; one named TCP port per container) with their real
//! sizes, derived from the pod and container names so a node is reproducible.
//! [`Kubelet::heavy_every`] adds one large annotation to some sandboxes, as meshes and
//! operators add (e.g. a sidecar injector's status, a few hundred bytes to kilobytes).

use std::collections::{BTreeMap, HashMap};

use plegd_runtime::{cri, PodRef};

pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
pub const CONFIG_SEEN: &str = "kubernetes.io/config.seen";
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub const RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
pub const TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
pub const TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
pub const CONTAINER_PORTS: &str = "io.kubernetes.container.ports";
/// The name of the large annotation of heavy sandboxes.
pub const HEAVY: &str = "sidecar.example.com/status";

/// How the simulated runtime dresses the node it is scripted to build: containerd's
/// IDs, kubelet's labels and annotations. `Default`: no heavy sandboxes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Kubelet {
    /// Every this-many-th sandbox (0: none) carries one more annotation ([`HEAVY`]) of
    /// [`Self::heavy_bytes`] bytes.
    pub heavy_every: usize,
    pub heavy_bytes: usize,
}

/// What a container carries besides its state, as the runtime stores it from its
/// config: labels, annotations, the image ID kubelet resolved its image to, and what
/// its status reports besides (mounts, log path, resources, user).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerMeta {
    pub labels: HashMap<String, String>,
    pub annotations: HashMap<String, String>,
    /// `sha256:` and 64 hex digits; empty: none.
    pub image_id: String,
    pub mounts: Vec<cri::Mount>,
    /// As the status reports it: under the pod's log directory.
    pub log_path: String,
    pub resources: Option<cri::LinuxContainerResources>,
    pub user: Option<cri::LinuxContainerUser>,
}

/// SplitMix64's finaliser: a bijection of u64 that looks random.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// FNV-1a of a string (stable across runs, unlike std's hasher).
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// 64 hex digits from `seed`, random-looking; distinct seeds give distinct digits
/// (the first 16 are a bijection of the seed).
fn hex64(seed: u64) -> String {
    let mut out = String::with_capacity(64);
    for k in 0..4u64 {
        out.push_str(&format!(
            "{:016x}",
            mix(seed ^ k.wrapping_mul(0x2545_f491_4f6c_dd1d))
        ));
    }
    out
}

/// The `n`th ID the runtime hands out, 64 hex digits as containerd's (random there).
pub fn containerd_id(n: u64) -> String {
    hex64(n)
}

/// `sha256:` and the 64 hex digits of the image a container named `name` runs (the
/// same for every pod's container of that name, as a Deployment's pods share images).
pub fn image_id(name: &str) -> String {
    format!("sha256:{}", hex64(fnv(name)))
}

/// Nanoseconds since the Unix epoch as RFC 3339 with nanoseconds, UTC (Go's
/// `time.RFC3339Nano`, which `kubernetes.io/config.seen` uses, drops trailing zeros;
/// the length here is the common one).
fn rfc3339_nano(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let nanos = ns.rem_euclid(1_000_000_000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Runs the first `pods` pods of a node of Deployments ([`deployment_pod`]) on `rt`:
/// pod `i` with UID `uid(i)` in `namespace`, each with `containers` running (by
/// name). Returns their sandbox IDs.
pub fn run_deployment_pods(
    rt: &crate::FakeRuntime,
    pods: usize,
    namespace: &str,
    uid: impl Fn(usize) -> String,
    containers: &[&str],
) -> Vec<String> {
    (0..pods)
        .map(|i| {
            let (name, labels) = deployment_pod(i);
            let sb = rt.run_pod_with_labels(&uid(i), &name, namespace, labels);
            for c in containers {
                rt.run_container(&sb, c);
            }
            sb
        })
        .collect()
}

/// Replicas of each Deployment [`deployment_pod`] names pods of.
pub const REPLICAS: usize = 10;

/// The `i`th pod of a node of Deployments of [`REPLICAS`] pods each: its name
/// (`{app}-{pod-template-hash}-{5 characters}`, as a ReplicaSet names its pods) and
/// its own labels (`app`, `pod-template-hash`).
pub fn deployment_pod(i: usize) -> (String, BTreeMap<String, String>) {
    let deployment = (i / REPLICAS) as u64;
    let app = format!("service-{deployment}");
    let hash = safe_chars(deployment, 10);
    let name = format!("{app}-{hash}-{}", safe_chars(i as u64 ^ (1 << 40), 5));
    let labels = BTreeMap::from([
        ("app".to_string(), app),
        ("pod-template-hash".to_string(), hash),
    ]);
    (name, labels)
}

/// A Deployment's pod-template-hash: 10 characters of Kubernetes' safe alphabet.
fn template_hash(seed: u64) -> String {
    safe_chars(seed, 10)
}

/// `n` characters of the alphabet Kubernetes makes generated names of.
fn safe_chars(seed: u64, n: usize) -> String {
    const SAFE: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut x = mix(seed);
    (0..n)
        .map(|_| {
            let c = SAFE[(x % SAFE.len() as u64) as usize] as char;
            x /= SAFE.len() as u64;
            c
        })
        .collect()
}

impl Kubelet {
    /// A sandbox's labels: the pod's own (`own`; if it has no `app`, an ordinary
    /// Deployment pod's `app` and `pod-template-hash`, from its name) and kubelet's.
    pub fn sandbox_labels(
        &self,
        pod: &PodRef,
        own: BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        let mut labels = own;
        if !labels.contains_key("app") {
            labels.insert("app".into(), pod.name.clone());
            labels.insert("pod-template-hash".into(), template_hash(fnv(&pod.name)));
        }
        labels.insert(POD_NAME.into(), pod.name.clone());
        labels.insert(POD_NAMESPACE.into(), pod.namespace.clone());
        labels.insert(POD_UID.into(), pod.uid.clone());
        labels
    }

    /// A sandbox's annotations (the pod's): kubelet's `config.seen` (when it admitted
    /// the pod) and `config.source`, and on every [`Self::heavy_every`]-th sandbox
    /// (`n` counts them) the heavy one.
    pub fn sandbox_annotations(&self, n: u64, created_at: i64) -> HashMap<String, String> {
        let mut a = HashMap::from([
            (CONFIG_SEEN.to_string(), rfc3339_nano(created_at)),
            (CONFIG_SOURCE.to_string(), "api".to_string()),
        ]);
        if self.heavy_every > 0 && n.is_multiple_of(self.heavy_every as u64) {
            a.insert(HEAVY.into(), heavy_value(self.heavy_bytes));
        }
        a
    }

    /// What kubelet sets on a container named `name` of `pod`, in its
    /// `restart_count`th attempt; `index` is its place in the pod spec (its port).
    pub fn container_meta(
        &self,
        pod: &PodRef,
        name: &str,
        index: usize,
        restart_count: u32,
    ) -> ContainerMeta {
        let labels = HashMap::from([
            (POD_NAME.to_string(), pod.name.clone()),
            (POD_NAMESPACE.to_string(), pod.namespace.clone()),
            (POD_UID.to_string(), pod.uid.clone()),
            (CONTAINER_NAME.to_string(), name.to_string()),
        ]);
        let ports = format!(
            r#"[{{"name":"http-{index}","containerPort":{},"protocol":"TCP"}}]"#,
            8080 + index
        );
        let annotations = HashMap::from([
            (
                CONTAINER_HASH.to_string(),
                format!("{:x}", fnv(name) as u32),
            ),
            (RESTART_COUNT.to_string(), restart_count.to_string()),
            (
                TERMINATION_MESSAGE_PATH.to_string(),
                "/dev/termination-log".to_string(),
            ),
            (TERMINATION_MESSAGE_POLICY.to_string(), "File".to_string()),
            (TERMINATION_GRACE_PERIOD.to_string(), "30".to_string()),
            (CONTAINER_PORTS.to_string(), ports),
        ]);
        let pod_dir = format!("/var/lib/kubelet/pods/{}", pod.uid);
        let mount = |container_path: &str, host_path: String, readonly: bool| cri::Mount {
            container_path: container_path.into(),
            host_path,
            readonly,
            ..Default::default()
        };
        let mounts = vec![
            mount(
                "/var/run/secrets/kubernetes.io/serviceaccount",
                format!(
                    "{pod_dir}/volumes/kubernetes.io~projected/kube-api-access-{}",
                    safe_chars(fnv(&pod.uid), 5)
                ),
                true,
            ),
            mount("/etc/hosts", format!("{pod_dir}/etc-hosts"), false),
            mount(
                "/dev/termination-log",
                format!(
                    "{pod_dir}/containers/{name}/{:08x}",
                    fnv(&format!("{}/{name}/{restart_count}", pod.uid)) as u32
                ),
                false,
            ),
        ];
        let log_path = format!(
            "/var/log/pods/{}_{}_{}/{name}/{restart_count}.log",
            pod.namespace, pod.name, pod.uid
        );
        ContainerMeta {
            labels,
            annotations,
            image_id: image_id(name),
            mounts,
            log_path,
            resources: Some(burstable_resources()),
            user: Some(cri::LinuxContainerUser {
                uid: 0,
                gid: 0,
                supplemental_groups: vec![0, 10],
            }),
        }
    }
}

/// The resources containerd reports for a container of 100m CPU and 256 MiB requested,
/// 500m and 256 MiB its limits (a Burstable pod), as its spec sets them.
fn burstable_resources() -> cri::LinuxContainerResources {
    let hugepages = |page_size: &str| cri::HugepageLimit {
        page_size: page_size.into(),
        limit: 0,
    };
    cri::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares: 102,
        memory_limit_in_bytes: 256 << 20,
        oom_score_adj: 968,
        hugepage_limits: vec![hugepages("2MB"), hugepages("1GB")],
        memory_swap_limit_in_bytes: 256 << 20,
        ..Default::default()
    }
}

/// A JSON-shaped value of `bytes` bytes (at least the JSON around it).
fn heavy_value(bytes: usize) -> String {
    let head = r#"{"initContainers":["init"],"containers":["proxy"],"volumes":[""#;
    let tail = r#""],"revision":1}"#;
    let fill = bytes.saturating_sub(head.len() + tail.len());
    format!("{head}{}{tail}", "v".repeat(fill))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodRef {
        PodRef {
            uid: "0000002a-0000-4000-8000-00000000002a".into(),
            name: "checkout-42".into(),
            namespace: "shop".into(),
        }
    }

    #[test]
    fn ids_are_64_hex_digits_and_distinct() {
        let ids: std::collections::HashSet<String> = (0..10_000).map(containerd_id).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids
            .iter()
            .all(|id| id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())));
        assert_eq!(image_id("app-0").len(), 71);
    }

    #[test]
    fn config_seen_is_rfc3339_with_nanoseconds() {
        assert_eq!(rfc3339_nano(0), "1970-01-01T00:00:00.000000000Z");
        // 2024-02-29T12:34:56.000000789Z
        assert_eq!(
            rfc3339_nano(1_709_210_096_000_000_789),
            "2024-02-29T12:34:56.000000789Z"
        );
    }

    #[test]
    fn a_sandbox_has_the_pods_labels_and_kubelets() {
        let k = Kubelet::default();
        let labels = k.sandbox_labels(&pod(), BTreeMap::new());
        assert_eq!(labels["app"], "checkout-42");
        assert_eq!(labels["pod-template-hash"].len(), 10);
        assert_eq!(labels[POD_UID], pod().uid);
        assert_eq!(labels[POD_NAME], "checkout-42");
        assert_eq!(labels[POD_NAMESPACE], "shop");
        let own = BTreeMap::from([("app".to_string(), "web".to_string())]);
        let labels = k.sandbox_labels(&pod(), own);
        assert_eq!(labels["app"], "web");
        assert!(!labels.contains_key("pod-template-hash"));
        let a = k.sandbox_annotations(3, 0);
        assert_eq!(a[CONFIG_SOURCE], "api");
        assert!(!a.contains_key(HEAVY));
    }

    #[test]
    fn deployment_pods_share_their_deployments_labels() {
        let (a, la) = deployment_pod(0);
        let (b, lb) = deployment_pod(1);
        let (c, lc) = deployment_pod(REPLICAS);
        assert!(c.starts_with("service-1-"));
        assert_ne!(a, b);
        assert_eq!(la, lb);
        assert_ne!(la["app"], lc["app"]);
        assert!(a.starts_with(&format!("{}-{}-", la["app"], la["pod-template-hash"])));
        assert_eq!(a.len(), "service-0-".len() + 10 + 1 + 5);
    }

    #[test]
    fn every_nth_sandbox_is_heavy() {
        let k = Kubelet {
            heavy_every: 4,
            heavy_bytes: 2048,
        };
        let heavy: Vec<u64> = (1..=12)
            .filter(|&n| k.sandbox_annotations(n, 0).contains_key(HEAVY))
            .collect();
        assert_eq!(heavy, vec![4, 8, 12]);
        assert_eq!(k.sandbox_annotations(4, 0)[HEAVY].len(), 2048);
    }

    #[test]
    fn a_container_has_kubelets_labels_and_annotations() {
        let m = Kubelet::default().container_meta(&pod(), "app-1", 1, 3);
        assert_eq!(m.labels[CONTAINER_NAME], "app-1");
        assert_eq!(m.labels[POD_UID], pod().uid);
        assert_eq!(m.annotations[RESTART_COUNT], "3");
        assert_eq!(m.annotations[TERMINATION_GRACE_PERIOD], "30");
        assert_eq!(
            m.annotations[CONTAINER_PORTS],
            r#"[{"name":"http-1","containerPort":8081,"protocol":"TCP"}]"#
        );
        assert!(m.image_id.starts_with("sha256:"));
    }
}
