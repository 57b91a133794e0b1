//! zklock's lock protocol as a model the [stateright] checker walks: every interleaving of
//! ZooKeeper sessions that expire, leader terms fenced by their epoch (in ZooKeeper and by the
//! API server's admission policy), claims' status writes that land late or are refused,
//! re-anchoring with its continuity rule, a foreign (Curator, kazoo) client, two clusters on one
//! directory, permits, and gated pods that run when their gate goes.
//!
//! Its files, each readable knowing the ones before it: `rules` (the rules the model can switch
//! off, each naming the code that implements it), `state` (the world), `step` (what may
//! happen, and what it changes), `scenario` (where the checker starts), `properties` (what
//! must hold). What the model leaves out, and why that is sound: docs/design.md, "The model".
#![forbid(unsafe_code)]

pub mod priorities;
mod properties;
mod rules;
mod scenario;
mod state;
mod step;

use std::time::{Duration, Instant};

use stateright::{Checker, Model, Property};

pub use properties::{
    DEPOSED_CHANGES_NOTHING, HELD_HOLDS, MUTUAL_EXCLUSION, NO_WAIT_FOR_EVER, POD_UNDER_HOLD, TOKENS_GROW,
};
pub use rules::{Rule, Rules};
pub use scenario::Scenario;
pub use state::State;
pub use step::Action;

/// The model of one scenario under a set of rules.
#[derive(Clone, Debug)]
pub struct ZklockModel {
    pub scenario: Scenario,
    pub rules: Rules,
    /// How many more of every fault than the scenario's first bounds the walk allows.
    pub more: u8,
    /// Lets a foreign client first queue while no zklock session watches the directory: beyond
    /// the continuity rule's premise (DESIGN.md §3: "only zklock claims of this operator use a
    /// lock path" unless a foreign node was ever seen), where the checker shows what happens.
    pub unwatched_foreign: bool,
    /// Removes a gated pod's gate on the answer of its claim's grant (in the same step), instead
    /// of in a step of its own once the `Held` is seen.
    pub ungate_on_answer: bool,
}

impl ZklockModel {
    pub fn new(scenario: Scenario, rules: Rules, more: u8) -> Self {
        ZklockModel { scenario, rules, more, unwatched_foreign: false, ungate_on_answer: false }
    }
}

impl Model for ZklockModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.scenario.init(self.more)]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        self.list_actions(state, actions)
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        self.apply(state, action)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}

/// What one walk found.
#[derive(Debug)]
pub struct Report {
    pub scenario: Scenario,
    pub off: Vec<Rule>,
    pub states: usize,
    pub unique_states: usize,
    pub max_depth: usize,
    pub elapsed: Duration,
    /// Each property that failed (or, for a "sometimes" property, that was reached), with the
    /// shortest path to it as the model prints it.
    pub discoveries: Vec<(&'static str, Vec<String>)>,
}

impl Report {
    /// The safety and liveness properties that failed (reachable examples left out).
    pub fn violated(&self) -> Vec<&'static str> {
        let failing =
            [MUTUAL_EXCLUSION, HELD_HOLDS, POD_UNDER_HOLD, TOKENS_GROW, DEPOSED_CHANGES_NOTHING, NO_WAIT_FOR_EVER];
        self.discoveries.iter().map(|(name, _)| *name).filter(|n| failing.contains(n)).collect()
    }

    pub fn trace(&self, property: &str) -> Option<String> {
        self.discoveries.iter().find(|(n, _)| *n == property).map(|(_, steps)| steps.join(" → "))
    }
}

/// Walks every state of `scenario` reachable under `rules`, breadth first, on `threads`
/// threads. With `until`, it looks for a shortest state that breaks that property instead:
/// walks bounded at one step more each time, until one is found (or the whole space is walked).
pub fn check(model: ZklockModel, threads: usize, until: Option<&'static str>) -> Report {
    let (scenario, rules) = (model.scenario, model.rules);
    let started = Instant::now();
    let walk = |depth: Option<usize>| {
        let checker = model.clone().checker().threads(threads);
        let checker = match depth {
            Some(depth) => checker.target_max_depth(depth),
            None => checker,
        };
        checker.spawn_bfs().join()
    };
    let checker = match until {
        None => walk(None),
        Some(property) => {
            let mut depth = 1;
            loop {
                depth += 1;
                let checker = walk(Some(depth));
                let whole = checker.max_depth() < depth;
                if checker.discovery(property).is_some() || whole {
                    break checker;
                }
            }
        }
    };
    let elapsed = started.elapsed();
    let discoveries = checker
        .discoveries()
        .into_iter()
        .map(|(name, path)| (name, path.into_actions().iter().map(|a| scenario.describe(a)).collect()))
        .collect();
    Report {
        scenario,
        off: rules.off(),
        states: checker.state_count(),
        unique_states: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        elapsed,
        discoveries,
    }
}

/// The scenario in which switching `rule` off shows its hole, and the property that fails.
pub fn shown_by(rule: Rule) -> (Scenario, &'static str) {
    match rule {
        Rule::ZkEpochGuard => (Scenario::Foreign, DEPOSED_CHANGES_NOTHING),
        Rule::EpochPolicy => (Scenario::Foreign, DEPOSED_CHANGES_NOTHING),
        Rule::ReplayAfterFence => (Scenario::Foreign, HELD_HOLDS),
        Rule::Continuity => (Scenario::Foreign, HELD_HOLDS),
        Rule::PlaceIsRecordedNode => (Scenario::Clusters, HELD_HOLDS),
        Rule::ServeBound => (Scenario::Clusters, MUTUAL_EXCLUSION),
        Rule::JudgedHold => (Scenario::Foreign, POD_UNDER_HOLD),
        Rule::NoGateWhileRevoked => (Scenario::Foreign, POD_UNDER_HOLD),
        Rule::FreshTokens => (Scenario::Permits, TOKENS_GROW),
        Rule::StatusBeforeRelease => (Scenario::Clusters, MUTUAL_EXCLUSION),
        Rule::SkipFinishedClaims => (Scenario::Ghost, NO_WAIT_FOR_EVER),
        Rule::SeeForeignCreates => (Scenario::ForeignArrives, HELD_HOLDS),
    }
}
