//! Kubernetes Events (events.k8s.io/v1) about claims. Each phase transition is reported once,
//! so there is nothing to aggregate into series: unlike kube-runtime's `Recorder`, this keeps
//! no cache of past events (which would grow with the number of claims).

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;

pub struct EventWriter {
    client: kube::Client,
    controller: String,
    instance: String,
}

impl EventWriter {
    pub fn new(client: kube::Client, instance: &str) -> Self {
        EventWriter { client, controller: "zklock.io/operator".into(), instance: instance.into() }
    }

    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        warning: bool,
        reason: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let name = regarding.name.clone().unwrap_or_default();
        let event = Event {
            metadata: ObjectMeta {
                // Unique, like the names client-go's recorders generate.
                name: Some(format!("{name}.{:x}", Timestamp::now().as_nanosecond())),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(Timestamp::now())),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            reason: Some(reason.into()),
            // events.k8s.io limits the note to 1 KiB.
            note: Some(note.chars().take(1000).collect()),
            action: Some("Reconcile".into()),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        };
        Api::<Event>::namespaced(self.client.clone(), &namespace).create(&PostParams::default(), &event).await?;
        Ok(())
    }
}
