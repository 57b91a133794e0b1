//! What every controller does with a reconcile that failed: count it under its error's metric
//! label, log it (a routine refusal quietly), and look again when the error says.

use std::sync::Arc;

use kube::runtime::controller::Action;
use kube::Resource;

use super::base::Error;
use crate::metrics::Metrics;

/// The error policy of the four controllers (claims, gated pods, `Lock`s, `ClusterLock`s),
/// whatever each one's context.
pub fn error_policy<K, C>(object: Arc<K>, error: &Error, ctx: Arc<C>) -> Action
where
    K: Resource<DynamicType = ()>,
    C: AsRef<Metrics>,
{
    (*ctx).as_ref().reconcile_errors.get_or_create(&crate::metrics::ErrorLabel { error: error.metric_label() }).inc();
    let kind = K::kind(&());
    let namespace = object.meta().namespace.as_deref().unwrap_or_default();
    let name = object.meta().name.as_deref().unwrap_or_default();
    if error.is_routine() {
        tracing::debug!(%kind, namespace, name, %error, "reconcile met a newer object");
    } else {
        tracing::warn!(%kind, namespace, name, %error, "reconcile failed");
    }
    error.retry_after().map_or_else(Action::await_change, Action::requeue)
}
