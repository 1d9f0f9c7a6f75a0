//! Listing: which instances are this provider's (its tags), what each one's EC2
//! state says of it, and the filters that ask EC2 for them.

use super::*;

/// What a listed instance says beyond its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Observed {
    /// AWS took or is taking it back (a spot interruption).
    pub(super) interrupted: bool,
    /// Terminated: no longer runway's concern, but for what it teaches.
    pub(super) gone: bool,
    /// Tagged with this provider's name under this controller's id.
    pub(super) proven: bool,
}

pub(super) fn state_filter(states: &[&str]) -> Filter {
    Filter::builder()
        .name("instance-state-name")
        .set_values(Some(states.iter().map(|s| (*s).to_owned()).collect()))
        .build()
}

pub(super) fn tag_filter(key: &str, values: Vec<String>) -> Filter {
    Filter::builder()
        .name(format!("tag:{key}"))
        .set_values(Some(values))
        .build()
}

pub(super) fn tag_value(tags: &[Tag], key: &str) -> Option<String> {
    tags.iter()
        .find(|t| t.key() == Some(key))
        .and_then(|t| t.value())
        .map(str::to_owned)
}

pub(super) fn tag(key: &str, value: &str) -> Tag {
    Tag::builder().key(key).value(value).build()
}

impl Ec2Provider {
    /// The running instance named `name`, if a create of it got through.
    pub(super) async fn find_by_name(&self, name: &str) -> Result<Option<Instance>, ProviderError> {
        let client = self.client().await;
        let described = client
            .describe_instances()
            .filters(tag_filter(CONTROLLER_TAG, self.controller_ids()))
            .filters(tag_filter(RUNNER_TAG, vec![name.to_owned()]))
            .filters(state_filter(&["pending", "running", "stopping", "stopped"]))
            .send()
            .await
            .map_err(|e| self.sdk_error("DescribeInstances", &e))?;
        Ok(described
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .find_map(|i| self.instance(i).map(|(instance, _)| instance)))
    }

    /// An EC2 instance as runway sees it, with whether AWS interrupted it;
    /// `None` for another provider's (its provider tag names another).
    pub(super) fn instance(
        &self,
        instance: &aws_sdk_ec2::types::Instance,
    ) -> Option<(Instance, Observed)> {
        let id = instance.instance_id()?;
        let proven = match tag_value(instance.tags(), PROVIDER_TAG) {
            Some(provider) if provider == self.config.name => true,
            Some(_) => return None,
            None => false,
        };
        let name = tag_value(instance.tags(), RUNNER_TAG).unwrap_or_default();
        let state = instance.state().and_then(|s| s.name());
        let interrupted = instance
            .state_reason()
            .and_then(|r| r.code())
            .is_some_and(|code| code == "Server.SpotInstanceTermination");
        let legacy = tag_value(instance.tags(), CONTROLLER_TAG).as_deref()
            != Some(self.config.controller_id.as_str());
        let observed = Observed {
            interrupted,
            gone: state == Some(&InstanceStateName::Terminated),
            proven: proven && !legacy,
        };
        let state = match state {
            Some(InstanceStateName::Pending) => InstanceState::Pending,
            Some(InstanceStateName::Running) => InstanceState::Running,
            // Still stopping: not yet startable, nor a machine at work.
            Some(InstanceStateName::Stopping) => InstanceState::Unknown,
            Some(InstanceStateName::Stopped) => InstanceState::Stopped,
            Some(InstanceStateName::ShuttingDown) | Some(InstanceStateName::Terminated) => {
                InstanceState::Failed
            }
            _ => InstanceState::Unknown,
        };
        Some((
            Instance {
                id: InstanceId(id.to_owned()),
                name,
                state,
            },
            observed,
        ))
    }
}
