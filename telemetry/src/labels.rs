//! The value sets of every metric label, as types: a label value is written once,
//! here, and every series is pre-created from these lists (a scrape shows zeros, not
//! absences). None of them can carry a pod UID, container ID, error text or endpoint.

macro_rules! label_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The label value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

label_enum! {
    /// Which relist detected a change (the `relist_source` label of KEP-3386); also
    /// the `relist_source` field of every published event.
    RelistSource {
        Global => "global",
        EventedPleg => "evented_pleg",
        PostSync => "post_sync",
        PostAllocation => "post_allocation",
        /// The NRI plugin (a container or sandbox stop/remove hook).
        Nri => "nri",
        /// containerd's own event service (task exit, OOM, delete).
        ContainerdEvents => "containerd_events",
    }
}

label_enum! {
    /// A relist hint source (`source` of `plegd_hint_source_state`); also its name in
    /// `--hint-sources`, logs and `/readyz`.
    HintSourceName {
        /// CRI GetContainerEvents.
        CriEvents => "cri-events",
        /// The NRI plugin.
        Nri => "nri",
        /// containerd's event service (containerd.services.events.v1).
        ContainerdEvents => "containerd-events",
    }
}

label_enum! {
    /// What a hint source is doing (`state` of `plegd_hint_source_state`).
    HintSourceState {
        /// Not selected (`--hint-sources`), or the runtime does not have it.
        Off => "off",
        /// Selected, not started yet.
        Detected => "detected",
        /// Connecting (on containerd, a stream is pending until its first item).
        Connecting => "connecting",
        /// Delivering hints.
        Streaming => "streaming",
        /// Failed; retrying after a capped backoff.
        Waiting => "waiting",
        /// The runtime does not implement it; retried every backoff cap.
        Unsupported => "unsupported",
        /// Stopped with plegd.
        Stopped => "stopped",
    }
}

label_enum! {
    /// What became of a targeted relist request (`result` of
    /// `plegd_relist_requests_total`).
    RequestResult {
        /// Entered the dispatcher's queue.
        Queued => "queued",
        /// Merged into a held pod's one pending relist.
        Coalesced => "coalesced",
        /// Replaced by a newer request for the same pod waiting in the dispatcher's
        /// next batch.
        Merged => "merged",
        /// The queue was full (the next global relist reconciles).
        Dropped => "dropped",
        /// A global relist that started after it was enqueued already covered the pod.
        Skipped => "skipped",
        /// The targeted relist ran.
        Done => "done",
    }
}

label_enum! {
    /// What became of a hint's container or sandbox ID the cache did not know
    /// (`result` of `plegd_hint_resolutions_total`).
    ResolveResult {
        /// Traced to its pod (a targeted relist of it follows).
        Found => "found",
        /// In no pod the runtime lists: nothing asked.
        NoPod => "no_pod",
        /// Over the rate: left to the next global relist.
        Limited => "limited",
        /// The runtime's answer failed.
        Failed => "failed",
    }
}

label_enum! {
    /// Where a relist failed (`phase` of `plegd_relist_errors_total`).
    RelistPhase {
        /// Listing sandboxes or containers: the whole relist failed.
        List => "list",
        /// Reading one pod's status: that pod is kept as it was.
        Status => "status",
    }
}

label_enum! {
    /// What became of a container status a targeted relist read together with the
    /// pod's lists (`result` of `plegd_relist_prefetch_total`).
    PrefetchResult {
        /// It agreed with the container's list entry and stood in for its read.
        Used => "used",
        /// It disagreed with the list entry: the container was read again.
        ReadAgain => "read_again",
        /// The call failed (NotFound included): the container was read as usual.
        Failed => "failed",
        /// Not needed: the container was not read (its status was reused, or it is
        /// not in the pod's lists), or the pod was not read (gone, held, lists failed).
        Unused => "unused",
    }
}

label_enum! {
    /// What the CRI event stream delivered (`type` of the stream events counter).
    StreamEventType {
        Created => "created",
        Started => "started",
        Stopped => "stopped",
        Deleted => "deleted",
        /// An event type this plegd does not know.
        Unknown => "unknown",
        /// No pod sandbox status, metadata or UID: ignored.
        Invalid => "invalid",
    }
}

label_enum! {
    /// Why plegd closed a subscriber API connection itself
    /// (`plegd_api_connections_closed_total{reason}`).
    ApiConnectionClose {
        /// The HTTP/2 client preface did not arrive within the handshake deadline.
        HandshakeTimeout => "handshake_timeout",
        /// The first bytes were not the HTTP/2 client preface.
        BadPreface => "bad_preface",
        /// Still in its handshake when newer connections took every handshake place.
        HandshakeEvicted => "handshake_evicted",
        /// Handshaken when every served place was taken (and none could be taken
        /// from a process holding more).
        TooManyConnections => "too_many_connections",
        /// Served, its place given to a connection of a process holding fewer.
        ServedEvicted => "served_evicted",
        /// No stream open for the idle timeout.
        Idle => "idle",
        /// Accepted with plegd's spare descriptor when out of descriptors, and closed.
        OutOfFds => "out_of_fds",
    }
}
