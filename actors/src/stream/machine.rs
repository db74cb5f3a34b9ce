//! The StreamWatcher's connection to the CRI event stream as one pure state machine
//! (KEP-3386 "Design Details": the stream is a hint, reconnected forever with a capped
//! backoff). [`Machine::step`] maps (state, input, now) to (next state, actions) with no
//! actor, runtime or clock; the watcher actor (watcher.rs) performs the actions. So
//! every reconnect path reads top to bottom in one `match` and is tested with a fake
//! clock.
//!
//! ```text
//!   Idle ──Start──> Connecting ──Opened──> Streaming ──StreamError / StreamEnded──> Waiting
//!                       │    │                 ^                                      │
//!                       │    └──Subscribed──> Subscribed ──AttemptFailed──> Waiting   │
//!                       │                      (Opened: Streaming)                    │
//!                       └─────AttemptFailed (incl. Unimplemented)─────> Waiting ──TimerFired──> Connecting
//!   any ──Stop──> Stopped   (cancels the RPC, the stream or the retry timer)
//! ```
//!
//! Measured runtime behaviour it encodes:
//! - containerd sends no response headers before its first event, so opening has no
//!   deadline and a pending attempt counts as a healthy connection since it began; an
//!   attempt with no error [`SUBSCRIBED_AFTER`] after its request went out is
//!   `Subscribed` (exported as streaming: the runtime has the subscription, a quiet
//!   runtime just has nothing to say yet);
//! - an open tonic stream reports its transport error twice before it ends, and items
//!   keep arriving after the actor cancels a stream: each stream input names its
//!   attempt, and only the first error or end of the current stream counts;
//! - EOF and a clean close are failures (CRI-O with pod events off closes at once).

use std::time::{Duration, Instant};

use plegd_telemetry::HintSourceState;

use crate::stream::reconnect::{AttemptEnd, ReconnectBackoff, ReconnectPolicy};

/// How long an attempt must go without an error to count as subscribed: a refused
/// connection, an unknown method or a missing socket fail within milliseconds.
pub(crate) const SUBSCRIBED_AFTER: Duration = Duration::from_millis(250);

/// One call of GetContainerEvents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Attempt {
    /// 1 for the first attempt; counts every attempt since start.
    pub number: u64,
    /// When it began: events created earlier were buffered by the runtime and say
    /// nothing about the stream's latency.
    pub started: Instant,
    /// The backoff delay waited before it: Some exactly when it follows a failure.
    pub after: Option<Duration>,
}

/// The watcher's state, as in the diagram above. Each variant carries all its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Not started yet.
    Idle,
    /// The RPC is in flight (on containerd, until the first event).
    Connecting(Attempt),
    /// The request went out and no error came within [`SUBSCRIBED_AFTER`] (at `since`);
    /// the stream arrives with the runtime's first item.
    Subscribed { attempt: Attempt, since: Instant },
    /// The stream delivered its first response at `opened` (or the attempt was
    /// subscribed then).
    Streaming { attempt: Attempt, opened: Instant },
    /// `failed` ended (`end` says how); the next attempt starts after `delay` (at
    /// `until`).
    Waiting {
        failed: Attempt,
        end: AttemptEnd,
        delay: Duration,
        until: Instant,
    },
    /// Stopped for good.
    Stopped {
        attempts: u64,
        last_delay: Option<Duration>,
    },
}

/// What happened, as the actor saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Input {
    /// The actor started.
    Start,
    /// The attempt's RPC returned a stream.
    Opened { attempt: u64 },
    /// [`SUBSCRIBED_AFTER`] passed since the attempt began.
    Subscribed { attempt: u64 },
    /// The attempt's RPC failed.
    AttemptFailed {
        attempt: u64,
        end: AttemptEnd,
        reason: String,
    },
    /// The attempt's stream yielded an error.
    StreamError {
        attempt: u64,
        end: AttemptEnd,
        reason: String,
    },
    /// The attempt's stream ended (EOF or a clean close).
    StreamEnded { attempt: u64 },
    /// The retry timer fired.
    TimerFired,
    /// Shut down.
    Stop,
}

/// What the actor must do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Call GetContainerEvents (no deadline) for this attempt.
    OpenStream {
        attempt: u64,
    },
    /// Read the stream the attempt opened, tagging its items with the attempt.
    ReadStream {
        attempt: u64,
    },
    /// Cancel the attempt, stream or timer in progress.
    Cancel,
    /// Feed [`Input::TimerFired`] after this delay.
    ScheduleRetry(Duration),
    /// Feed [`Input::Subscribed`] for this attempt after this delay.
    ConfirmAfter {
        attempt: u64,
        delay: Duration,
    },
    /// Ask the dispatcher for the next global relist now: events around a reconnect
    /// may be lost.
    BringGlobalRelistForward,
    CountReconnectAttempt,
    CountConnectionSuccess,
    CountConnectionError,
    /// The stream-connected gauge.
    SetConnected(bool),
    Log(LogLine),
    /// Stop the actor.
    StopActor,
}

/// Log lines the actor writes (rate-limited: a flapping runtime must not flood logs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LogLine {
    Opened { attempt: u64 },
    Unavailable { reason: String, retry_in: Duration },
}

/// The state and the backoff it decides delays with.
pub(crate) struct Machine {
    state: State,
    backoff: ReconnectBackoff,
}

impl Machine {
    pub fn new(policy: ReconnectPolicy) -> Self {
        Machine {
            state: State::Idle,
            backoff: ReconnectBackoff::new(policy),
        }
    }

    /// The one transition function: every change of state happens here.
    pub fn step(&mut self, input: Input, now: Instant) -> Vec<Action> {
        use Action::*;
        let state = std::mem::replace(&mut self.state, State::Idle);
        let (next, actions) = match (state, input) {
            (State::Idle, Input::Start) => {
                let first = Attempt {
                    number: 1,
                    started: now,
                    after: None,
                };
                (
                    State::Connecting(first),
                    vec![
                        OpenStream { attempt: 1 },
                        ConfirmAfter {
                            attempt: 1,
                            delay: SUBSCRIBED_AFTER,
                        },
                    ],
                )
            }
            // Every attempt after a failure brings the global relist forward: containerd
            // confirms an open only with its next event (never, on a quiet node), so the
            // relist cannot wait for Opened. The dispatcher honours one working
            // bring-forward per period and a failed one (runtime still down) does not
            // count, so asking on each attempt of an outage costs nothing extra.
            (State::Waiting { failed, delay, .. }, Input::TimerFired) => {
                let next = Attempt {
                    number: failed.number + 1,
                    started: now,
                    after: Some(delay),
                };
                (
                    State::Connecting(next),
                    vec![
                        CountReconnectAttempt,
                        BringGlobalRelistForward,
                        OpenStream {
                            attempt: next.number,
                        },
                        ConfirmAfter {
                            attempt: next.number,
                            delay: SUBSCRIBED_AFTER,
                        },
                    ],
                )
            }
            // The first open after a failure asks again: the relist asked for when the
            // attempt began may have run before the runtime registered the
            // subscription, and events in between never reach the stream. (Within one
            // period the dispatcher may ignore it; the periodic relist then covers
            // the gap.)
            (State::Connecting(a), Input::Opened { attempt }) if attempt == a.number => {
                let mut actions = vec![
                    CountConnectionSuccess,
                    SetConnected(true),
                    Log(LogLine::Opened { attempt }),
                    ReadStream { attempt },
                ];
                if a.after.is_some() {
                    actions.push(BringGlobalRelistForward);
                }
                (
                    State::Streaming {
                        attempt: a,
                        opened: now,
                    },
                    actions,
                )
            }
            // No error so far: the runtime has the subscription. The first open after
            // a failure asks for the relist again (as `Opened` does).
            (State::Connecting(a), Input::Subscribed { attempt }) if attempt == a.number => {
                let mut actions = vec![
                    CountConnectionSuccess,
                    SetConnected(true),
                    Log(LogLine::Opened { attempt }),
                ];
                if a.after.is_some() {
                    actions.push(BringGlobalRelistForward);
                }
                (
                    State::Subscribed {
                        attempt: a,
                        since: now,
                    },
                    actions,
                )
            }
            (State::Subscribed { attempt: a, since }, Input::Opened { attempt })
                if attempt == a.number =>
            {
                (
                    State::Streaming {
                        attempt: a,
                        opened: since,
                    },
                    vec![ReadStream { attempt }],
                )
            }
            (
                State::Subscribed { attempt: a, since },
                Input::AttemptFailed {
                    attempt,
                    end,
                    reason,
                },
            ) if attempt == a.number => self.fail(a, since, end, reason, now, vec![]),
            // The RPC is over: nothing to cancel. A pending attempt was up since it
            // began (containerd sends no headers before its first event).
            (
                State::Connecting(a),
                Input::AttemptFailed {
                    attempt,
                    end,
                    reason,
                },
            ) if attempt == a.number => self.fail(a, a.started, end, reason, now, vec![]),
            (
                State::Streaming { attempt: a, opened },
                Input::StreamError {
                    attempt,
                    end,
                    reason,
                },
            ) if attempt == a.number => self.fail(a, opened, end, reason, now, vec![Cancel]),
            (State::Streaming { attempt: a, opened }, Input::StreamEnded { attempt })
                if attempt == a.number =>
            {
                let reason = "the event stream ended".to_string();
                self.fail(a, opened, AttemptEnd::Failed, reason, now, vec![Cancel])
            }
            (State::Idle, Input::Stop) => (
                State::Stopped {
                    attempts: 0,
                    last_delay: None,
                },
                vec![SetConnected(false), StopActor],
            ),
            (
                state @ (State::Connecting(_)
                | State::Subscribed { .. }
                | State::Streaming { .. }
                | State::Waiting { .. }),
                Input::Stop,
            ) => (
                State::Stopped {
                    attempts: attempts(&state),
                    last_delay: last_delay(&state),
                },
                vec![Cancel, SetConnected(false), StopActor],
            ),
            // Anything else is stale (an item of a stream already given up, a second
            // error of the same stream, its end after its error) or out of place:
            // nothing changes.
            (state, _) => (state, vec![]),
        };
        self.state = next;
        actions
    }

    /// The attempt `a`, up since `up_since`, ended: wait, then try again.
    fn fail(
        &mut self,
        a: Attempt,
        up_since: Instant,
        end: AttemptEnd,
        reason: String,
        now: Instant,
        mut actions: Vec<Action>,
    ) -> (State, Vec<Action>) {
        let delay = self.backoff.failed(up_since, now, end);
        actions.extend([
            Action::SetConnected(false),
            Action::CountConnectionError,
            Action::Log(LogLine::Unavailable {
                reason,
                retry_in: delay,
            }),
            Action::ScheduleRetry(delay),
        ]);
        let waiting = State::Waiting {
            failed: a,
            end,
            delay,
            until: now + delay,
        };
        (waiting, actions)
    }

    #[cfg(test)]
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The state's name (for tests and logs).
    pub fn state_name(&self) -> &'static str {
        match self.state {
            State::Idle => "idle",
            State::Connecting(_) => "connecting",
            State::Subscribed { .. } => "subscribed",
            State::Streaming { .. } => "streaming",
            State::Waiting { .. } => "waiting",
            State::Stopped { .. } => "stopped",
        }
    }

    /// The state as a hint source exports it: a source waiting after Unimplemented is
    /// `unsupported`.
    pub fn source_state(&self) -> HintSourceState {
        match self.state {
            State::Idle => HintSourceState::Detected,
            State::Connecting(_) => HintSourceState::Connecting,
            State::Subscribed { .. } | State::Streaming { .. } => HintSourceState::Streaming,
            State::Waiting {
                end: AttemptEnd::Unimplemented | AttemptEnd::Absent { .. },
                ..
            } => HintSourceState::Unsupported,
            State::Waiting { .. } => HintSourceState::Waiting,
            State::Stopped { .. } => HintSourceState::Stopped,
        }
    }

    /// Attempts made so far.
    pub fn attempts(&self) -> u64 {
        attempts(&self.state)
    }

    /// The reconnect delay chosen after the last failure.
    pub fn last_delay(&self) -> Option<Duration> {
        last_delay(&self.state)
    }

    /// When the current (or, while waiting, the last) attempt began.
    pub fn attempt_started(&self) -> Option<Instant> {
        match &self.state {
            State::Connecting(a)
            | State::Subscribed { attempt: a, .. }
            | State::Streaming { attempt: a, .. }
            | State::Waiting { failed: a, .. } => Some(a.started),
            State::Idle | State::Stopped { .. } => None,
        }
    }
}

fn attempts(state: &State) -> u64 {
    match state {
        State::Idle => 0,
        State::Connecting(a)
        | State::Subscribed { attempt: a, .. }
        | State::Streaming { attempt: a, .. }
        | State::Waiting { failed: a, .. } => a.number,
        State::Stopped { attempts, .. } => *attempts,
    }
}

fn last_delay(state: &State) -> Option<Duration> {
    match state {
        State::Idle => None,
        State::Connecting(a)
        | State::Subscribed { attempt: a, .. }
        | State::Streaming { attempt: a, .. } => a.after,
        State::Waiting { delay, .. } => Some(*delay),
        State::Stopped { last_delay, .. } => *last_delay,
    }
}

#[cfg(test)]
mod tests {
    use super::Action::*;
    use super::*;

    const BASE: Duration = Duration::from_millis(100);
    const CAP: Duration = Duration::from_secs(60);
    const HEALTHY: Duration = Duration::from_secs(60);

    fn machine() -> Machine {
        Machine::new(ReconnectPolicy::new(BASE, CAP, HEALTHY).unwrap())
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn failed(attempt: u64) -> Input {
        Input::AttemptFailed {
            attempt,
            end: AttemptEnd::Failed,
            reason: "connection refused".into(),
        }
    }

    fn stream_error(attempt: u64) -> Input {
        Input::StreamError {
            attempt,
            end: AttemptEnd::Failed,
            reason: "h2 protocol error".into(),
        }
    }

    /// The delay a failure scheduled (the machine must schedule exactly one).
    fn retry(actions: &[Action]) -> Duration {
        let delays: Vec<Duration> = actions
            .iter()
            .filter_map(|a| match a {
                ScheduleRetry(d) => Some(*d),
                _ => None,
            })
            .collect();
        assert_eq!(delays.len(), 1, "{actions:?}");
        delays[0]
    }

    fn unavailable(reason: &str, retry_in: Duration) -> Action {
        Log(LogLine::Unavailable {
            reason: reason.into(),
            retry_in,
        })
    }

    fn confirm(attempt: u64) -> Action {
        ConfirmAfter {
            attempt,
            delay: SUBSCRIBED_AFTER,
        }
    }

    /// A machine streaming on attempt 1, opened at `t0`.
    fn streaming(t0: Instant) -> Machine {
        let mut m = machine();
        m.step(Input::Start, t0);
        m.step(Input::Opened { attempt: 1 }, t0);
        m
    }

    #[test]
    fn start_opens_the_first_attempt_without_bringing_the_relist_forward() {
        let mut m = machine();
        let t0 = Instant::now();
        assert_eq!(m.state(), &State::Idle);
        assert_eq!(
            m.step(Input::Start, t0),
            vec![OpenStream { attempt: 1 }, confirm(1)]
        );
        assert_eq!(
            m.state(),
            &State::Connecting(Attempt {
                number: 1,
                started: t0,
                after: None
            })
        );
        assert_eq!((m.attempts(), m.last_delay()), (1, None));
    }

    #[test]
    fn the_first_open_streams_without_bringing_the_relist_forward() {
        let mut m = machine();
        let t0 = Instant::now();
        m.step(Input::Start, t0);
        let t1 = t0 + secs(5); // containerd: the first event came 5 s later
        assert_eq!(
            m.step(Input::Opened { attempt: 1 }, t1),
            vec![
                CountConnectionSuccess,
                SetConnected(true),
                Log(LogLine::Opened { attempt: 1 }),
                ReadStream { attempt: 1 },
            ]
        );
        assert!(matches!(
            m.state(),
            State::Streaming { attempt, opened } if attempt.started == t0 && *opened == t1
        ));
        assert_eq!(m.attempt_started(), Some(t0));
    }

    #[test]
    fn a_failed_attempt_waits_then_retries_and_brings_the_relist_forward_twice() {
        let mut m = machine();
        let t0 = Instant::now();
        m.step(Input::Start, t0);
        // The RPC is over: nothing to cancel. The first retry is immediate.
        assert_eq!(
            m.step(failed(1), t0),
            vec![
                SetConnected(false),
                CountConnectionError,
                unavailable("connection refused", Duration::ZERO),
                ScheduleRetry(Duration::ZERO),
            ]
        );
        assert!(matches!(
            m.state(),
            State::Waiting { failed, delay, until, .. }
                if failed.number == 1 && delay.is_zero() && *until == t0
        ));
        // Each attempt after a failure asks for the relist (containerd may confirm the
        // open only much later) ...
        assert_eq!(
            m.step(Input::TimerFired, t0),
            vec![
                CountReconnectAttempt,
                BringGlobalRelistForward,
                OpenStream { attempt: 2 },
                confirm(2),
            ]
        );
        let d = retry(&m.step(failed(2), t0));
        assert!(d >= BASE * 8 / 10 && d <= BASE * 12 / 10, "{d:?}");
        let t1 = t0 + d;
        assert_eq!(
            m.step(Input::TimerFired, t1),
            vec![
                CountReconnectAttempt,
                BringGlobalRelistForward,
                OpenStream { attempt: 3 },
                confirm(3),
            ]
        );
        assert_eq!(m.last_delay(), Some(d));
        // ... and so does the first open after it.
        assert_eq!(
            m.step(Input::Opened { attempt: 3 }, t1),
            vec![
                CountConnectionSuccess,
                SetConnected(true),
                Log(LogLine::Opened { attempt: 3 }),
                ReadStream { attempt: 3 },
                BringGlobalRelistForward,
            ]
        );
        assert_eq!((m.state_name(), m.attempts()), ("streaming", 3));
    }

    #[test]
    fn a_stream_error_cancels_the_stream_and_retries() {
        let t0 = Instant::now();
        let mut m = streaming(t0);
        assert_eq!(
            m.step(stream_error(1), t0 + secs(1)),
            vec![
                Cancel,
                SetConnected(false),
                CountConnectionError,
                unavailable("h2 protocol error", Duration::ZERO),
                ScheduleRetry(Duration::ZERO),
            ]
        );
        assert_eq!(m.state_name(), "waiting");
    }

    #[test]
    fn eof_and_a_clean_close_are_failures() {
        let t0 = Instant::now();
        let mut m = streaming(t0);
        assert_eq!(
            m.step(Input::StreamEnded { attempt: 1 }, t0),
            vec![
                Cancel,
                SetConnected(false),
                CountConnectionError,
                unavailable("the event stream ended", Duration::ZERO),
                ScheduleRetry(Duration::ZERO),
            ]
        );
        m.step(Input::TimerFired, t0);
        m.step(Input::Opened { attempt: 2 }, t0);
        // A runtime that closes every stream at once (CRI-O with pod events off) gets
        // a growing delay, not a tight loop.
        let d = retry(&m.step(Input::StreamEnded { attempt: 2 }, t0));
        assert!(d >= BASE * 8 / 10, "{d:?}");
    }

    #[test]
    fn only_the_first_error_or_end_of_the_current_stream_counts() {
        let t0 = Instant::now();
        let mut m = streaming(t0);
        assert!(!m.step(stream_error(1), t0).is_empty());
        let waiting = m.state().clone();
        // tonic reports the error a second time, then the stream ends; items keep
        // coming after the actor cancelled it.
        for stale in [stream_error(1), Input::StreamEnded { attempt: 1 }] {
            assert_eq!(m.step(stale, t0), vec![]);
            assert_eq!(m.state(), &waiting);
        }
        m.step(Input::TimerFired, t0);
        // While attempt 2 connects, and once it streams, attempt 1 is stale.
        let stale = [
            stream_error(1),
            Input::StreamEnded { attempt: 1 },
            Input::Opened { attempt: 1 },
            failed(1),
        ];
        for input in stale.clone() {
            assert_eq!(m.step(input, t0), vec![]);
            assert_eq!(m.state_name(), "connecting");
        }
        m.step(Input::Opened { attempt: 2 }, t0);
        for input in stale {
            assert_eq!(m.step(input, t0), vec![]);
            assert_eq!((m.state_name(), m.attempts()), ("streaming", 2));
        }
        // Its own error counts (the second failure in a row: about the base delay).
        let d = retry(&m.step(stream_error(2), t0));
        assert!(d >= BASE * 8 / 10 && d <= BASE * 12 / 10, "{d:?}");
    }

    #[test]
    fn unimplemented_waits_the_cap_every_time() {
        let mut m = machine();
        let mut now = Instant::now();
        assert_eq!(m.source_state(), HintSourceState::Detected);
        m.step(Input::Start, now);
        assert_eq!(m.source_state(), HintSourceState::Connecting);
        for attempt in 1..=5 {
            let actions = m.step(
                Input::AttemptFailed {
                    attempt,
                    end: AttemptEnd::Unimplemented,
                    reason: "unknown service".into(),
                },
                now,
            );
            assert_eq!(retry(&actions), CAP, "attempt {attempt}");
            assert!(matches!(m.state(), State::Waiting { until, .. } if *until == now + CAP));
            // A hint source says so: the runtime does not have it.
            assert_eq!(m.source_state(), HintSourceState::Unsupported);
            now += CAP;
            m.step(Input::TimerFired, now);
        }
        // Any other failure is an ordinary wait.
        m.step(failed(6), now);
        assert_eq!(m.source_state(), HintSourceState::Waiting);
        m.step(Input::TimerFired, now);
        let now = now + CAP;
        // Mid-stream too (a proxy in front of an older runtime).
        m.step(Input::Opened { attempt: 7 }, now);
        assert_eq!(m.source_state(), HintSourceState::Streaming);
        let actions = m.step(
            Input::StreamError {
                attempt: 7,
                end: AttemptEnd::Unimplemented,
                reason: "unknown service".into(),
            },
            now,
        );
        assert_eq!(retry(&actions), CAP);
        m.step(Input::Stop, now);
        assert_eq!(m.source_state(), HintSourceState::Stopped);
    }

    /// Fails attempts in a row at `now` until the backoff has grown.
    fn grown(m: &mut Machine, now: Instant) -> u64 {
        m.step(Input::Start, now);
        for attempt in 1..=5 {
            m.step(failed(attempt), now);
            m.step(Input::TimerFired, now);
        }
        6
    }

    #[test]
    fn a_quiet_healthy_stream_resets_the_backoff() {
        // containerd sends no headers until the first event: an attempt pending longer
        // than healthy_reset is a healthy stream on a quiet node.
        let mut m = machine();
        let t0 = Instant::now();
        let attempt = grown(&mut m, t0);
        assert!(m.last_delay().unwrap() >= BASE * 8 * 8 / 10);
        assert_eq!(
            retry(&m.step(failed(attempt), t0 + HEALTHY)),
            Duration::ZERO
        );
        // Pending for less than that: the backoff keeps growing.
        let mut m = machine();
        let attempt = grown(&mut m, t0);
        let before = m.last_delay().unwrap();
        let d = retry(&m.step(failed(attempt), t0 + HEALTHY - secs(1)));
        assert!(d > before, "{d:?} after {before:?}");
    }

    #[test]
    fn an_open_stream_resets_the_backoff_after_a_healthy_period_since_it_opened() {
        let mut m = machine();
        let t0 = Instant::now();
        let attempt = grown(&mut m, t0);
        let opened = t0 + secs(10);
        m.step(Input::Opened { attempt }, opened);
        // Flapping: open 59 s (69 s since the attempt began), then an error: no reset.
        let d = retry(&m.step(stream_error(attempt), opened + HEALTHY - secs(1)));
        assert!(d >= BASE * 16 * 8 / 10, "{d:?}");
        let t1 = opened + secs(100);
        m.step(Input::TimerFired, t1);
        m.step(
            Input::Opened {
                attempt: attempt + 1,
            },
            t1 + secs(30),
        );
        // Healthy for a minute since it opened: the next retry is immediate.
        let end = Input::StreamEnded {
            attempt: attempt + 1,
        };
        assert_eq!(retry(&m.step(end, t1 + secs(30) + HEALTHY)), Duration::ZERO);
    }

    #[test]
    fn stop_from_every_state_cancels_what_runs_and_stops_for_good() {
        let t0 = Instant::now();
        let running = vec![Cancel, SetConnected(false), StopActor];
        let cases: Vec<(&str, Vec<Input>, Vec<Action>, u64)> = vec![
            ("idle", vec![], vec![SetConnected(false), StopActor], 0),
            ("connecting", vec![Input::Start], running.clone(), 1),
            (
                "streaming",
                vec![Input::Start, Input::Opened { attempt: 1 }],
                running.clone(),
                1,
            ),
            ("waiting", vec![Input::Start, failed(1)], running.clone(), 1),
            (
                "reconnecting",
                vec![Input::Start, failed(1), Input::TimerFired],
                running.clone(),
                2,
            ),
        ];
        for (name, path, expected, attempts) in cases {
            let mut m = machine();
            for input in path {
                m.step(input, t0);
            }
            assert_eq!(m.step(Input::Stop, t0), expected, "stop while {name}");
            assert_eq!(m.state_name(), "stopped");
            assert_eq!(m.attempts(), attempts, "{name}");
            // Stopped is final: nothing restarts it, a second Stop does nothing.
            let all = [
                Input::Start,
                Input::Opened { attempt: attempts },
                failed(attempts),
                stream_error(attempts),
                Input::StreamEnded { attempt: attempts },
                Input::TimerFired,
                Input::Stop,
            ];
            for input in all {
                assert_eq!(m.step(input, t0), vec![], "{name}");
                assert_eq!(m.state_name(), "stopped");
            }
        }
    }

    #[test]
    fn every_input_in_every_state_goes_where_the_diagram_says() {
        let t0 = Instant::now();
        // (how to get there, attempt in progress)
        let states: Vec<(&str, Vec<Input>, u64)> = vec![
            ("idle", vec![], 1),
            ("connecting", vec![Input::Start], 1),
            (
                "streaming",
                vec![Input::Start, Input::Opened { attempt: 1 }],
                1,
            ),
            (
                "subscribed",
                vec![Input::Start, Input::Subscribed { attempt: 1 }],
                1,
            ),
            ("waiting", vec![Input::Start, failed(1)], 1),
            ("stopped", vec![Input::Stop], 1),
        ];
        let inputs = |n: u64| -> Vec<(&'static str, Input)> {
            vec![
                ("start", Input::Start),
                ("opened", Input::Opened { attempt: n }),
                ("subscribed", Input::Subscribed { attempt: n }),
                ("attempt failed", failed(n)),
                ("stream error", stream_error(n)),
                ("stream ended", Input::StreamEnded { attempt: n }),
                ("timer", Input::TimerFired),
                ("stop", Input::Stop),
            ]
        };
        // The diagram; every pair not listed leaves the state unchanged.
        let expected = |state: &str, input: &str| -> &'static str {
            match (state, input) {
                (_, "stop") => "stopped",
                ("idle", "start") => "connecting",
                ("connecting", "opened") => "streaming",
                ("connecting", "subscribed") => "subscribed",
                ("connecting", "attempt failed") => "waiting",
                ("subscribed", "opened") => "streaming",
                ("subscribed", "attempt failed") => "waiting",
                ("streaming", "stream error" | "stream ended") => "waiting",
                ("waiting", "timer") => "connecting",
                ("idle", _) => "idle",
                ("connecting", _) => "connecting",
                ("streaming", _) => "streaming",
                ("subscribed", _) => "subscribed",
                ("waiting", _) => "waiting",
                _ => "stopped",
            }
        };
        for (state, path, n) in states {
            for (input_name, input) in inputs(n) {
                let mut m = machine();
                for i in path.clone() {
                    m.step(i, t0);
                }
                let before = m.state().clone();
                let actions = m.step(input, t0);
                let want = expected(state, input_name);
                assert_eq!(m.state_name(), want, "{state} --{input_name}-->");
                if want == state {
                    assert_eq!(m.state(), &before, "{state} --{input_name}--> changed");
                    assert_eq!(actions, vec![], "{state} --{input_name}--> acted");
                }
            }
        }
    }

    /// A quiet runtime (containerd sends no headers before its first event): an
    /// attempt with no error SUBSCRIBED_AFTER after it began is up and exported as
    /// streaming; its stream is read when it comes.
    #[test]
    fn an_attempt_without_an_error_is_subscribed_and_its_stream_read_when_it_comes() {
        let mut m = machine();
        let t0 = Instant::now();
        m.step(Input::Start, t0);
        let t1 = t0 + SUBSCRIBED_AFTER;
        assert_eq!(
            m.step(Input::Subscribed { attempt: 1 }, t1),
            vec![
                CountConnectionSuccess,
                SetConnected(true),
                Log(LogLine::Opened { attempt: 1 }),
            ]
        );
        assert_eq!(m.source_state(), HintSourceState::Streaming);
        let t2 = t0 + secs(30);
        assert_eq!(
            m.step(Input::Opened { attempt: 1 }, t2),
            vec![ReadStream { attempt: 1 }]
        );
        // Up since it was subscribed, not since the first item.
        assert!(matches!(m.state(), State::Streaming { opened, .. } if *opened == t1));
        // A late confirmation of a stream already read changes nothing.
        assert_eq!(m.step(Input::Subscribed { attempt: 1 }, t2), vec![]);
    }

    #[test]
    fn a_subscribed_attempt_that_fails_waits_and_a_stale_confirmation_is_ignored() {
        let mut m = machine();
        let t0 = Instant::now();
        m.step(Input::Start, t0);
        m.step(Input::Subscribed { attempt: 1 }, t0 + SUBSCRIBED_AFTER);
        let actions = m.step(failed(1), t0 + secs(1));
        assert!(actions.contains(&SetConnected(false)), "{actions:?}");
        assert_eq!(m.source_state(), HintSourceState::Waiting);
        // The retry's own confirmation is for attempt 2; attempt 1's is stale.
        m.step(Input::TimerFired, t0 + secs(2));
        assert_eq!(
            m.step(Input::Subscribed { attempt: 1 }, t0 + secs(3)),
            vec![]
        );
        assert_eq!(m.source_state(), HintSourceState::Connecting);
        // The first confirmation after a failure brings the relist forward.
        let actions = m.step(Input::Subscribed { attempt: 2 }, t0 + secs(3));
        assert!(actions.contains(&BringGlobalRelistForward), "{actions:?}");
    }
}
