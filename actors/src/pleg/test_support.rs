//! Tests: entry points of the Generic PLEG that only tests use.

use super::generic::{EarlyDeaths, GenericPleg, PodStep};
use super::output::RelistOutput;
use crate::event::RelistSource;
use plegd_runtime::RuntimeError;

impl GenericPleg {
    /// Targeted relists of several pods as one output (see
    /// [`Self::relist_pods_each`], without early deaths): the pods whose lists
    /// failed are returned with their errors.
    pub async fn relist_pods(
        &mut self,
        pods: &[(String, RelistSource, Vec<String>)],
        held: &dyn Fn(&str) -> bool,
    ) -> (RelistOutput, Vec<(String, RuntimeError)>) {
        let mut all = RelistOutput::default();
        let mut failed = Vec::new();
        self.relist_pods_each(pods.to_vec(), None, None, held, EarlyDeaths::Off, |step| {
            if let PodStep::Read((uid, ..), out, error) = step {
                all.append(out);
                if let Some(e) = error {
                    failed.push((uid, e));
                }
            }
            std::future::ready(())
        })
        .await;
        (all, failed)
    }
}
