//! The restart suite's subscriber: a Watch over plegd's API that, whenever its stream
//! ends (plegd stopped or was killed) or cannot be opened (plegd is down), connects
//! again and resumes with `since_revision` = the last revision it has and the
//! instance id of its first Hello, as a client such as `plegd watch --instance-id`
//! does; and the check that everything it received, across every restart, is one
//! exact account: revisions 1, 2, 3, ... each once, from one instance.
//!
//! A Gap (the stream's queue overflowed) is recovered as the protocol says: Watch
//! again from the Gap's `after_revision`; the replay fills it, so the account has no
//! hole either way. A resume that plegd refuses (FAILED_PRECONDITION: `other-instance`,
//! `too-old`, `future`) cannot be recovered without a re-list: it is recorded and the
//! subscriber stops.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use plegd_api::v1::{self, watch_response::Kind};
use tokio::task::JoinHandle;

/// How long the subscriber waits before trying again while plegd is down.
const RETRY: Duration = Duration::from_millis(5);

/// One thing the subscriber saw, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Got {
    /// A Watch call was answered (the stream opened) from `since`, for `instance`.
    Opened {
        since: u64,
        instance: String,
    },
    Hello {
        instance_id: String,
        latest_revision: u64,
    },
    Event(Box<v1::Event>),
    Bookmark(u64),
    Gap {
        after: u64,
        through: u64,
    },
    /// The stream ended: cleanly (None) or with this status.
    Ended(Option<String>),
    /// plegd refused the resume: the code, the message and the `plegd-reason`.
    Refused(String),
}

#[derive(Default)]
struct Shared {
    got: Vec<Got>,
    /// Set by the subscriber when it gives up (a refused resume).
    stopped: bool,
}

/// The subscriber, running on the current runtime until dropped.
pub struct ResumingWatch {
    shared: Arc<Mutex<Shared>>,
    task: JoinHandle<()>,
}

fn lock(m: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl ResumingWatch {
    /// Starts watching plegd at `socket` from its first revision (since 0), trying
    /// until plegd answers.
    pub fn start(socket: PathBuf) -> Self {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let task = tokio::spawn(watch(socket, shared.clone()));
        ResumingWatch { shared, task }
    }

    /// Everything seen so far.
    pub fn got(&self) -> Vec<Got> {
        lock(&self.shared).got.clone()
    }

    /// The last event revision received (0: none).
    pub fn last_revision(&self) -> u64 {
        lock(&self.shared)
            .got
            .iter()
            .rev()
            .find_map(|g| match g {
                Got::Event(e) => Some(e.revision),
                _ => None,
            })
            .unwrap_or(0)
    }

    /// The subscriber gave up (a refused resume).
    pub fn stopped(&self) -> bool {
        lock(&self.shared).stopped
    }
}

impl Drop for ResumingWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn watch(socket: PathBuf, shared: Arc<Mutex<Shared>>) {
    let push = |g: Got| lock(&shared).got.push(g);
    // The resume point and the instance it belongs to (empty until the first Hello).
    let mut since = 0u64;
    let mut instance = String::new();
    loop {
        let Ok(mut client) = plegd_api::connect(&socket).await else {
            tokio::time::sleep(RETRY).await;
            continue;
        };
        let request = v1::WatchRequest {
            since_revision: Some(since),
            instance_id: instance.clone(),
            ..v1::WatchRequest::default()
        };
        let mut stream = match client.watch(request).await {
            Ok(s) => s.into_inner(),
            Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                let reason = status
                    .metadata()
                    .get("plegd-reason")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_string();
                push(Got::Refused(format!(
                    "{:?} {} (plegd-reason {reason}), resuming from {since} of {instance}",
                    status.code(),
                    status.message()
                )));
                lock(&shared).stopped = true;
                return;
            }
            // plegd stopping or starting: its socket answers, the service not yet.
            Err(_) => {
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        push(Got::Opened {
            since,
            instance: instance.clone(),
        });
        loop {
            match stream.message().await {
                Ok(Some(msg)) => match msg.kind {
                    Some(Kind::Hello(h)) => {
                        if instance.is_empty() {
                            instance.clone_from(&h.instance_id);
                        }
                        push(Got::Hello {
                            instance_id: h.instance_id,
                            latest_revision: h.latest_revision,
                        });
                    }
                    Some(Kind::Event(e)) => {
                        since = since.max(e.revision);
                        push(Got::Event(Box::new(e)));
                    }
                    Some(Kind::Bookmark(b)) => push(Got::Bookmark(b.revision)),
                    Some(Kind::Gap(g)) => {
                        push(Got::Gap {
                            after: g.after_revision,
                            through: g.through_revision,
                        });
                        // Recovery: resume from where the loss began.
                        since = g.after_revision;
                        break;
                    }
                    None => {}
                },
                Ok(None) => {
                    push(Got::Ended(None));
                    break;
                }
                Err(status) => {
                    push(Got::Ended(Some(format!(
                        "{:?} {}",
                        status.code(),
                        status.message()
                    ))));
                    break;
                }
            }
        }
    }
}

/// What the subscriber received, checked: the events in revision order (the account,
/// with duplicates from a Gap's replay left out) and every problem with the stream.
pub fn check_stream(got: &[Got]) -> (Vec<v1::Event>, Vec<String>) {
    let mut account: Vec<v1::Event> = Vec::new();
    let mut problems = Vec::new();
    let mut instance: Option<&str> = None;
    // Per stream: whether its Hello came, its last seq; and the Gap that ended the
    // previous stream (its replay may repeat revisions this subscriber has).
    let mut hello = true;
    let mut seq = 0u64;
    let mut replay_after_gap: Option<u64> = None;
    for (i, g) in got.iter().enumerate() {
        match g {
            Got::Opened { since, .. } => {
                let last = account.last().map_or(0, |e| e.revision);
                if replay_after_gap.is_none() && *since != last {
                    problems.push(format!(
                        "message {i}: resumed from {since}, but the last revision received was {last}"
                    ));
                }
                hello = false;
                seq = 0;
            }
            Got::Hello {
                instance_id,
                latest_revision,
            } => {
                if hello {
                    problems.push(format!("message {i}: a second Hello on one stream"));
                }
                hello = true;
                match instance {
                    None => instance = Some(instance_id),
                    Some(first) if first != instance_id => problems.push(format!(
                        "message {i}: Hello of instance {instance_id}, the first was {first}"
                    )),
                    Some(_) => {}
                }
                // A restarted plegd goes on from every revision it ever showed.
                let last = account.last().map_or(0, |e| e.revision);
                if *latest_revision < last {
                    problems.push(format!(
                        "message {i}: Hello's latest revision {latest_revision} is below {last}, already received"
                    ));
                }
            }
            Got::Event(e) => {
                if !hello {
                    problems.push(format!("message {i}: an event before the Hello"));
                }
                if e.seq != seq + e.missed + 1 {
                    problems.push(format!(
                        "message {i}: seq {} after {seq} with missed {}",
                        e.seq, e.missed
                    ));
                }
                seq = e.seq;
                if e.snapshot {
                    problems.push(format!("message {i}: a snapshot event, none was asked"));
                }
                let last = account.last().map_or(0, |e| e.revision);
                if e.revision <= last {
                    // The replay after a Gap may resend what this subscriber had.
                    let resent = replay_after_gap.is_some_and(|a| e.revision > a);
                    if !resent {
                        problems.push(format!(
                            "message {i}: revision {} again (or out of order) after {last}",
                            e.revision
                        ));
                    }
                    continue;
                }
                if e.revision != last + 1 {
                    problems.push(format!(
                        "message {i}: revision {} after {last}: {} revisions missing, no Gap said so",
                        e.revision,
                        e.revision - last - 1
                    ));
                }
                replay_after_gap = None;
                account.push((**e).clone());
            }
            Got::Bookmark(r) => {
                let last = account.last().map_or(0, |e| e.revision);
                if *r < last {
                    problems.push(format!(
                        "message {i}: bookmark {r} behind revision {last} received"
                    ));
                }
            }
            Got::Gap { after, .. } => replay_after_gap = Some(*after),
            Got::Ended(_) => {}
            Got::Refused(why) => problems.push(format!("message {i}: resume refused: {why}")),
        }
    }
    (account, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(revision: u64, seq: u64) -> Got {
        Got::Event(Box::new(v1::Event {
            revision,
            seq,
            ..v1::Event::default()
        }))
    }

    fn opened(since: u64) -> Got {
        Got::Opened {
            since,
            instance: "a".into(),
        }
    }

    fn hello(latest: u64) -> Got {
        Got::Hello {
            instance_id: "a".into(),
            latest_revision: latest,
        }
    }

    #[test]
    fn an_exact_account_across_restarts_passes() {
        let got = vec![
            opened(0),
            hello(0),
            ev(1, 1),
            ev(2, 2),
            Got::Ended(None),
            opened(2),
            hello(4),
            ev(3, 1),
            ev(4, 2),
            Got::Gap {
                after: 4,
                through: 6,
            },
            opened(4),
            hello(6),
            ev(5, 1),
            ev(6, 2),
        ];
        let (account, problems) = check_stream(&got);
        assert!(problems.is_empty(), "{problems:?}");
        let revs: Vec<u64> = account.iter().map(|e| e.revision).collect();
        assert_eq!(revs, [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn a_hole_a_duplicate_another_instance_and_lost_revisions_are_found() {
        let hole = [opened(0), hello(0), ev(1, 1), ev(3, 2)];
        assert_eq!(check_stream(&hole).1.len(), 1, "{:?}", check_stream(&hole));
        let dup = [
            opened(0),
            hello(0),
            ev(1, 1),
            Got::Ended(None),
            opened(1),
            hello(1),
            ev(1, 1),
        ];
        assert_eq!(check_stream(&dup).1.len(), 1);
        let other = [
            opened(0),
            hello(0),
            ev(1, 1),
            opened(1),
            Got::Hello {
                instance_id: "b".into(),
                latest_revision: 5,
            },
        ];
        assert_eq!(check_stream(&other).1.len(), 1);
        // After a restart, plegd's latest revision is below one it had shown.
        let lost = [opened(0), hello(0), ev(1, 1), ev(2, 2), opened(2), hello(1)];
        assert_eq!(check_stream(&lost).1.len(), 1);
        let refused = [opened(0), hello(0), Got::Refused("future".into())];
        assert_eq!(check_stream(&refused).1.len(), 1);
    }
}
