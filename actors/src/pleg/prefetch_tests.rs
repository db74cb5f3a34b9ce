//! A targeted relist's prefetch (`status` module docs): the status of the container an
//! event is about is read together with the pod's lists and stands in for its read
//! only if it agrees with the list; a prefetch that fails, or a pod that is not read,
//! changes nothing else. Each case through both paths: the single relist and a batch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::tests::global;
use super::*;
use crate::event::{EventKind::*, RelistSource};
use crate::testing::wait_until;
use plegd_runtime::{ContainerStatus, RuntimeClient, RuntimeError};
use plegd_sim::{FakeRuntime, Intercept, Intercepted, Op};

/// The fake runtime, counting the ContainerStatus calls answered, by id.
#[derive(Clone)]
struct Spy {
    inner: FakeRuntime,
    answered: Arc<Mutex<HashMap<String, usize>>>,
}

impl Spy {
    fn answered(&self, id: &str) -> usize {
        self.answered.lock().unwrap().get(id).copied().unwrap_or(0)
    }
}

#[async_trait::async_trait]
impl Intercept for Spy {
    fn inner(&self) -> &FakeRuntime {
        &self.inner
    }

    async fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        let out = self.inner.container_status(id).await;
        *self.answered.lock().unwrap().entry(id.into()).or_default() += 1;
        out
    }
}

/// A pod `u1` with one running container, behind a [`Spy`], its first relist done
/// (and not counted).
async fn one_pod() -> (FakeRuntime, Spy, GenericPleg, String) {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let spy = Spy {
        inner: rt.clone(),
        answered: Arc::default(),
    };
    let mut p = GenericPleg::new(Arc::new(Intercepted(spy.clone())), 4);
    global(&mut p).await;
    spy.answered.lock().unwrap().clear();
    (rt, spy, p, c)
}

#[derive(Clone, Copy, Debug)]
enum Path {
    Single,
    Batch,
}

const PATHS: [Path; 2] = [Path::Single, Path::Batch];

/// A targeted relist of `u1` asking to prefetch `prefetch`, by `path`.
async fn relist(
    p: &mut GenericPleg,
    path: Path,
    prefetch: &[&str],
) -> Result<RelistOutput, RuntimeError> {
    let prefetch: Vec<String> = prefetch.iter().map(|s| s.to_string()).collect();
    match path {
        Path::Single => {
            let scope = RelistScope::Pod {
                uid: "u1".into(),
                source: RelistSource::EventedPleg,
                prefetch,
            };
            p.relist(&scope, &|_| false).await
        }
        Path::Batch => {
            let pods = [("u1".to_string(), RelistSource::EventedPleg, prefetch)];
            let (out, mut failed) = p.relist_pods(&pods, &|_| false).await;
            match failed.pop() {
                Some((_, e)) => Err(e),
                None => Ok(out),
            }
        }
    }
}

/// The one ContainerDied of `out`: its container and (exit code, reason).
fn death(out: &RelistOutput) -> (String, Option<(i32, Option<String>)>) {
    let died: Vec<_> = out
        .events
        .iter()
        .filter(|e| e.kind == ContainerDied)
        .collect();
    assert_eq!(died.len(), 1, "{:?}", out.events);
    let exit = died[0].exit.as_ref().map(|x| (x.code, x.reason.clone()));
    (died[0].container_id.clone(), exit)
}

fn counts(used: usize, read_again: usize, failed: usize, unused: usize) -> PrefetchCounts {
    PrefetchCounts {
        used,
        read_again,
        failed,
        unused,
    }
}

/// The stopped container's status is read while the pod's lists are
/// in flight (ListContainers answers only once it has been), once, and the death
/// carries its exit.
#[tokio::test]
async fn the_stopped_containers_status_is_read_with_the_lists_once() {
    for path in PATHS {
        let (rt, spy, mut p, c) = one_pod().await;
        rt.oom_kill_container(&c);
        rt.hold(Op::ListContainers);
        let release = async {
            wait_until("the prefetch answered while ListContainers waits", || {
                spy.answered(&c) == 1
            })
            .await;
            rt.release(Op::ListContainers);
        };
        let ids = [c.as_str()];
        let (out, ()) = tokio::join!(relist(&mut p, path, &ids), release);
        let out = out.unwrap();
        assert_eq!(
            death(&out),
            (c.clone(), Some((137, Some("OOMKilled".into())))),
            "{path:?}"
        );
        assert_eq!(spy.answered(&c), 1, "{path:?}: no second read");
        assert_eq!(out.prefetch, counts(1, 0, 0, 0), "{path:?}");
    }
}

/// Without a container to prefetch, the relist calls what it called before: the
/// container's status once, after the lists.
#[tokio::test]
async fn a_relist_without_a_container_prefetches_nothing() {
    for path in PATHS {
        let (rt, spy, mut p, c) = one_pod().await;
        rt.exit_container(&c, 2);
        let out = relist(&mut p, path, &[]).await.unwrap();
        assert_eq!(
            death(&out),
            (c.clone(), Some((2, Some("Error".into())))),
            "{path:?}"
        );
        assert_eq!(spy.answered(&c), 1, "{path:?}");
        assert_eq!(out.prefetch, PrefetchCounts::default(), "{path:?}");
    }
}

/// The prefetch answers Running; the container exits before ListContainers answers:
/// the prefetched status disagrees with the list, so the container is read again and
/// the death carries its exit.
#[tokio::test]
async fn a_prefetch_the_list_disagrees_with_is_read_again() {
    for path in PATHS {
        let (rt, spy, mut p, c) = one_pod().await;
        rt.hold(Op::ListContainers);
        let exit_then_list = async {
            wait_until("the prefetch answered", || spy.answered(&c) == 1).await;
            rt.exit_container(&c, 1);
            rt.release(Op::ListContainers);
        };
        let ids = [c.as_str()];
        let (out, ()) = tokio::join!(relist(&mut p, path, &ids), exit_then_list);
        let out = out.unwrap();
        assert_eq!(
            death(&out),
            (c.clone(), Some((1, Some("Error".into())))),
            "{path:?}"
        );
        assert_eq!(spy.answered(&c), 2, "{path:?}: read again");
        assert_eq!(out.prefetch, counts(0, 1, 0, 0), "{path:?}");
    }
}

/// A prefetch that fails (an error, NotFound, an id that is not there) only means
/// "not prefetched": the relist succeeds as before, reads the container, and nothing
/// is to reinspect.
#[tokio::test]
async fn a_prefetch_that_fails_changes_nothing_else() {
    for path in PATHS {
        for code in [tonic::Code::Unavailable, tonic::Code::NotFound] {
            let (rt, spy, mut p, c) = one_pod().await;
            rt.exit_container(&c, 1);
            // The prefetch is the relist's first ContainerStatus call.
            rt.fail(Op::ContainerStatus, code, Some(1));
            let out = relist(&mut p, path, &[&c]).await.unwrap();
            assert_eq!(
                death(&out),
                (c.clone(), Some((1, Some("Error".into())))),
                "{path:?} {code:?}"
            );
            assert_eq!(spy.answered(&c), 2, "{path:?} {code:?}");
            assert_eq!(out.status_errors, 0, "{path:?} {code:?}");
            assert!(!p.needs_reinspection("u1"), "{path:?} {code:?}");
            assert_eq!(out.prefetch, counts(0, 0, 1, 0), "{path:?} {code:?}");
        }
        let (rt, _spy, mut p, c) = one_pod().await;
        rt.exit_container(&c, 1);
        let out = relist(&mut p, path, &["not-there", &c]).await.unwrap();
        assert_eq!(death(&out).0, c, "{path:?}");
        assert_eq!(out.prefetch, counts(1, 0, 1, 0), "{path:?}");
    }
}

/// A pod whose lists fail is not read: the relist fails as before (the batch reports
/// the pod), and its prefetch went unused; the next relist publishes the death.
#[tokio::test]
async fn a_prefetch_whose_lists_fail_goes_unused() {
    let (rt, _spy, mut p, c) = one_pod().await;
    rt.exit_container(&c, 1);
    rt.fail(Op::ListContainers, tonic::Code::Unavailable, Some(1));
    let pods = [("u1".to_string(), RelistSource::EventedPleg, vec![c.clone()])];
    let (out, failed) = p.relist_pods(&pods, &|_| false).await;
    assert_eq!(failed.len(), 1);
    assert!(out.events.is_empty());
    assert_eq!(out.prefetch, counts(0, 0, 0, 1));
    let out = relist(&mut p, Path::Single, &[&c]).await.unwrap();
    assert_eq!(death(&out), (c, Some((1, Some("Error".into())))));
}

/// A prefetched container that is not in the pod's lists (another pod's), or of a pod
/// that is gone, is not read: its prefetch goes unused.
#[tokio::test]
async fn a_prefetch_of_a_container_not_read_goes_unused() {
    for path in PATHS {
        let (rt, _spy, mut p, c) = one_pod().await;
        let other_sb = rt.run_pod("u2", "db", "ns");
        let other = rt.run_container(&other_sb, "db");
        let out = relist(&mut p, path, &[&other]).await.unwrap();
        assert!(out.events.is_empty(), "{path:?}");
        assert_eq!(out.prefetch, counts(0, 0, 0, 1), "{path:?}");
        // The pod is gone (its containers with it: a prefetch of one fails): nothing
        // read, a prefetch that answered unused.
        let sb = p
            .record("u1")
            .unwrap()
            .sandboxes
            .keys()
            .next()
            .unwrap()
            .to_string();
        rt.remove_pod(&sb);
        let out = relist(&mut p, path, &[&c, &other]).await.unwrap();
        assert!(
            out.events.iter().any(|e| e.kind == ContainerRemoved),
            "{path:?}"
        );
        assert_eq!(out.prefetch, counts(0, 0, 1, 1), "{path:?}");
    }
}
