//! Trace export from a test's side: the identity the tests export under.

use plegd_telemetry::traces::Identity;

/// The node, host and version every test-exported span carries.
pub fn identity() -> Identity {
    Identity {
        node_name: "test-node".into(),
        host_name: "test-host".into(),
        service_version: "0.0.0-test".into(),
    }
}
