//! Wire protocols: the CRI v1 API (client and server, from the maintained `k8s-cri`
//! crate) and, later, plegd's own subscriber API. Nothing of substance lives here.

/// CRI `runtime.v1`: messages, `RuntimeServiceClient` and `RuntimeServiceServer`.
pub use k8s_cri::v1 as cri;
