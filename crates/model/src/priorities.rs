//! Priorities in a lock directory (docs/design.md, "4. Priorities"), as a model of its own: the
//! directory's children, clients that enqueue, read, are granted, release and crash, and the
//! rule that makes a grant safe. Written before the recipe code, to show that the design's two
//! rules are needed and enough, and that the order first written down preempts a holder.
//!
//! A client first looks at the directory: if nobody waits and the granted nodes leave room for
//! it, it creates its *granted* node at once (the direct grant, under the `cversion` it read).
//! Otherwise it enqueues a *waiting* node (`wait-<id>-p<priority>-lock-<seq>`) and reads the
//! directory; if its node is the head of the waiting nodes, ordered by (priority descending,
//! sequence), and the granted nodes leave room (a mutex: none, or only Shared ones for a Shared
//! waiter; permits: fewer than they), it is granted by a *conversion*: one multi-op that checks
//! the directory's `cversion` it read, deletes its waiting node and creates its granted node.
//! Granted nodes rank ahead of every waiting node, so nothing overtakes a holder. The model's
//! rules:
//! - [`PriorityRule::GrantedFirst`]: the order puts granted nodes first. Off, the naive order
//!   (every node by priority, then sequence, the holders being the first `permits`) is used, as
//!   the contract first written said: a later, higher-priority node takes a holder's place.
//! - [`PriorityRule::CversionCheck`]: the conversion checks the `cversion` its decision read.
//!   Off, a decision made on an older directory is carried out: two heads of two reads.
//! - [`PriorityRule::WatchAhead`]: a waiter whose turn has not come watches the node right
//!   ahead of it (the head waiter: the granted nodes, any of whose departures makes room). Off,
//!   it watches nothing, and is never woken.
//!
//! Left out (to model with the recipe's code, docs/design.md "4. Priorities"): sessions that
//! expire under a holder that still runs (the main model's), tickets and re-anchoring.

use stateright::{Checker, Model, Property};

/// A rule of the prioritized directory that the model can switch off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PriorityRule {
    GrantedFirst,
    CversionCheck,
    WatchAhead,
}

/// How many may hold at once: a mutex (one Exclusive holder, or Shared holders together), or
/// permits (that many, whatever their modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    Mutex,
    Permits(usize),
}

/// A node of the directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    pub client: u8,
    /// ZooKeeper's sequence: creation order.
    pub seq: u8,
    pub granted: bool,
}

/// Where a client stands.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Client {
    Idle,
    /// It looked at the directory (`cversion`) before enqueueing: `free` if nobody waited and
    /// the granted nodes left it room (then it creates its granted node at once).
    Looked {
        cversion: u8,
        free: bool,
    },
    /// Its waiting node exists; `read`: its last decision, if it has one it still stands by.
    Queued {
        read: Option<Read>,
    },
    /// It believes it holds the lock (and acts on it).
    Holding,
    Done,
}

/// A client's decision from one read of the children.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Read {
    /// The directory's `cversion` it read.
    pub cversion: u8,
    /// Be granted now (the conversion comes next).
    pub convert: bool,
    /// Not yet: the sequences of the nodes it watches, whose deletion wakes it (herd-free: the
    /// node right ahead of it; the head waiter, the granted nodes that hold its permit back).
    pub watching: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PriorityState {
    pub nodes: Vec<Node>,
    pub cversion: u8,
    pub next_seq: u8,
    pub clients: Vec<Client>,
    pub crashes_left: u8,
    /// A grant went to a waiter that was not the head of the waiting nodes when it was made.
    pub out_of_order: bool,
    /// Each client has read "not yet" at least once (for the reachability check).
    pub waited: Vec<bool>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PriorityAction {
    /// A client arrives and looks at the directory.
    Look(u8),
    /// It creates its granted node at once, under the `cversion` it looked at.
    GrantAtOnce(u8),
    /// It creates its waiting node.
    Enqueue(u8),
    /// The client reads the children and decides.
    Read(u8),
    /// The client's conversion multi-op (or, under the naive order, it takes its hold).
    Convert(u8),
    Release(u8),
    /// The client's process dies and its session ends: its node goes.
    Crash(u8),
}

/// The model: clients of these priorities (in arrival order as the walk chooses it), the
/// Shared ones, the limit.
#[derive(Clone, Debug)]
pub struct PriorityModel {
    pub priorities: Vec<u8>,
    /// The clients that want the lock Shared (with a mutex; permits ignore modes).
    pub shared: Vec<u8>,
    pub limit: Limit,
    pub crashes: u8,
    pub off: Vec<PriorityRule>,
}

pub const PRIORITY_MUTUAL_EXCLUSION: &str = "no more believe they hold than the limit and modes allow";
pub const PRIORITY_ORDER: &str = "a grant goes to the head of the waiters: highest priority, then first come";
pub const PRIORITY_NO_WAIT_FOR_EVER: &str = "no client waits for ever";
pub const PRIORITY_WOKEN: &str = "a waiter whose turn has come has been woken";

impl PriorityModel {
    fn on(&self, rule: PriorityRule) -> bool {
        !self.off.contains(&rule)
    }

    fn priority(&self, node: &Node) -> u8 {
        self.priorities[node.client as usize]
    }

    fn is_shared(&self, client: u8) -> bool {
        self.limit == Limit::Mutex && self.shared.contains(&client)
    }

    /// Whether `holders` may hold together: the rule the recipe keeps.
    fn allowed(&self, holders: &[u8]) -> bool {
        match self.limit {
            Limit::Permits(permits) => holders.len() <= permits,
            Limit::Mutex => holders.len() <= 1 || holders.iter().all(|c| self.is_shared(*c)),
        }
    }

    /// Whether the granted nodes leave room for `client`.
    fn room(&self, granted: &[Node], client: u8) -> bool {
        let mut holders: Vec<u8> = granted.iter().map(|n| n.client).collect();
        holders.push(client);
        self.allowed(&holders)
    }

    /// The directory's order, what every client computes from the children alone.
    fn order(&self, nodes: &[Node]) -> Vec<Node> {
        let mut order = nodes.to_vec();
        if self.on(PriorityRule::GrantedFirst) {
            order.sort_by_key(|n| (!n.granted, std::cmp::Reverse(self.priority(n)), n.seq));
        } else {
            order.sort_by_key(|n| (std::cmp::Reverse(self.priority(n)), n.seq));
        }
        order
    }

    /// Whether `client` should be granted now, by the recipe, from the children alone.
    fn may_be_granted(&self, nodes: &[Node], client: u8) -> bool {
        let order = self.order(nodes);
        let Some(place) = order.iter().position(|n| n.client == client) else { return false };
        if self.on(PriorityRule::GrantedFirst) {
            let granted: Vec<Node> = order.iter().copied().filter(|n| n.granted).collect();
            // The head waiter (the first node that is not granted), with room.
            place == granted.len() && self.room(&granted, client)
        } else {
            // The naive order: today's recipe over it (the first `permits` nodes; a mutex's
            // first Exclusive node, or Shared ones with no Exclusive one ahead).
            match self.limit {
                Limit::Permits(permits) => place < permits,
                Limit::Mutex if self.is_shared(client) => order[..place].iter().all(|n| self.is_shared(n.client)),
                Limit::Mutex => place == 0,
            }
        }
    }

    /// What a waiter whose turn has not come watches (see [`Read::watching`]).
    fn watch(&self, nodes: &[Node], client: u8) -> Vec<u8> {
        if !self.on(PriorityRule::WatchAhead) {
            return vec![];
        }
        let order = self.order(nodes);
        let Some(place) = order.iter().position(|n| n.client == client) else { return vec![] };
        let granted = order.iter().filter(|n| n.granted).count();
        if self.on(PriorityRule::GrantedFirst) && place == granted {
            order[..granted].iter().map(|n| n.seq).collect()
        } else {
            order[..place].last().map(|n| n.seq).into_iter().collect()
        }
    }

    /// Whether a client arriving now may be granted at once: nobody waits, and there is room.
    fn free_for(&self, nodes: &[Node], client: u8) -> bool {
        let granted: Vec<Node> = nodes.iter().copied().filter(|n| n.granted).collect();
        self.on(PriorityRule::GrantedFirst) && granted.len() == nodes.len() && self.room(&granted, client)
    }

    fn head_waiter(&self, nodes: &[Node]) -> Option<u8> {
        let waiting: Vec<Node> = nodes.iter().copied().filter(|n| !n.granted).collect();
        let mut order = waiting;
        order.sort_by_key(|n| (std::cmp::Reverse(self.priority(n)), n.seq));
        order.first().map(|n| n.client)
    }

    fn create(s: &mut PriorityState, client: u8, granted: bool) {
        s.nodes.push(Node { client, seq: s.next_seq, granted });
        s.next_seq += 1;
        s.cversion += 1;
    }

    fn delete(s: &mut PriorityState, client: u8) {
        let before = s.nodes.len();
        s.nodes.retain(|n| n.client != client);
        if s.nodes.len() != before {
            s.cversion += 1;
        }
    }

    /// Walks every state; answers the properties that failed, each with its shortest path.
    pub fn check(self) -> Vec<(&'static str, Vec<PriorityAction>)> {
        let checker = self.checker().spawn_bfs().join();
        let failing = [PRIORITY_MUTUAL_EXCLUSION, PRIORITY_ORDER, PRIORITY_NO_WAIT_FOR_EVER, PRIORITY_WOKEN];
        checker
            .discoveries()
            .into_iter()
            .filter(|(name, _)| failing.contains(name))
            .map(|(name, path)| (name, path.into_actions()))
            .collect()
    }

    /// The shortest path to a state that breaks `property`, if any: walks bounded at one step
    /// more each time (a breadth-first walk's first discovery need not be its shortest).
    pub fn shortest(self, property: &'static str) -> Option<Vec<PriorityAction>> {
        for depth in 1.. {
            let checker = self.clone().checker().target_max_depth(depth).spawn_bfs().join();
            if let Some(path) = checker.discovery(property) {
                return Some(path.into_actions());
            }
            if checker.max_depth() < depth {
                return None;
            }
        }
        None
    }

    /// Whether the walk reaches a state where some client holds after waiting behind another.
    pub fn reaches_a_grant_after_a_wait(self) -> bool {
        let checker = self.checker().spawn_bfs().join();
        checker.discovery("a client is granted after it waited").is_some()
    }
}

impl Model for PriorityModel {
    type State = PriorityState;
    type Action = PriorityAction;

    fn init_states(&self) -> Vec<PriorityState> {
        vec![PriorityState {
            nodes: vec![],
            cversion: 0,
            next_seq: 0,
            clients: vec![Client::Idle; self.priorities.len()],
            crashes_left: self.crashes,
            out_of_order: false,
            waited: vec![false; self.priorities.len()],
        }]
    }

    fn actions(&self, s: &PriorityState, actions: &mut Vec<PriorityAction>) {
        for (i, client) in s.clients.iter().enumerate() {
            let i = i as u8;
            match client {
                Client::Idle => actions.push(PriorityAction::Look(i)),
                Client::Looked { free: true, .. } => actions.push(PriorityAction::GrantAtOnce(i)),
                Client::Looked { free: false, .. } => actions.push(PriorityAction::Enqueue(i)),
                Client::Queued { read: None } => actions.push(PriorityAction::Read(i)),
                Client::Queued { read: Some(read) } if read.convert => actions.push(PriorityAction::Convert(i)),
                Client::Queued { read: Some(read) } => {
                    // Woken by a watch: a node it watches is gone.
                    if read.watching.iter().any(|seq| !s.nodes.iter().any(|n| n.seq == *seq)) {
                        actions.push(PriorityAction::Read(i));
                    }
                }
                Client::Holding => actions.push(PriorityAction::Release(i)),
                Client::Done => {}
            }
            if s.crashes_left > 0 && matches!(client, Client::Queued { .. } | Client::Holding) {
                actions.push(PriorityAction::Crash(i));
            }
        }
    }

    fn next_state(&self, s: &PriorityState, action: PriorityAction) -> Option<PriorityState> {
        let mut s = s.clone();
        match action {
            PriorityAction::Look(c) => {
                let free = self.free_for(&s.nodes, c);
                s.clients[c as usize] = Client::Looked { cversion: s.cversion, free };
            }
            PriorityAction::GrantAtOnce(c) => {
                let Client::Looked { cversion, free: true } = s.clients[c as usize] else { return None };
                if self.on(PriorityRule::CversionCheck) && cversion != s.cversion {
                    // The check fails: it looks again.
                    s.clients[c as usize] = Client::Idle;
                    return Some(s);
                }
                if s.nodes.iter().any(|n| !n.granted) {
                    // Somebody waits: a grant at once jumps the queue.
                    s.out_of_order = true;
                }
                Self::create(&mut s, c, true);
                s.clients[c as usize] = Client::Holding;
            }
            PriorityAction::Enqueue(c) => {
                Self::create(&mut s, c, false);
                s.clients[c as usize] = Client::Queued { read: None };
            }
            PriorityAction::Read(c) => {
                let convert = self.may_be_granted(&s.nodes, c);
                let watching = if convert { vec![] } else { self.watch(&s.nodes, c) };
                s.waited[c as usize] |= !convert;
                s.clients[c as usize] = Client::Queued { read: Some(Read { cversion: s.cversion, convert, watching }) };
            }
            PriorityAction::Convert(c) => {
                let Client::Queued { read: Some(Read { cversion: read, convert: true, .. }) } = s.clients[c as usize]
                else {
                    return None;
                };
                if self.on(PriorityRule::CversionCheck) && read != s.cversion {
                    // The multi-op's check fails: nothing changes, the client reads again.
                    s.clients[c as usize] = Client::Queued { read: None };
                    return Some(s);
                }
                if self.head_waiter(&s.nodes) != Some(c) {
                    s.out_of_order = true;
                }
                if self.on(PriorityRule::GrantedFirst) {
                    Self::delete(&mut s, c);
                    Self::create(&mut s, c, true);
                }
                s.clients[c as usize] = Client::Holding;
            }
            PriorityAction::Release(c) => {
                Self::delete(&mut s, c);
                s.clients[c as usize] = Client::Done;
            }
            PriorityAction::Crash(c) => {
                Self::delete(&mut s, c);
                s.clients[c as usize] = Client::Done;
                s.crashes_left -= 1;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(PRIORITY_MUTUAL_EXCLUSION, |m: &PriorityModel, s: &PriorityState| {
                let holders: Vec<u8> =
                    (0..s.clients.len() as u8).filter(|c| s.clients[*c as usize] == Client::Holding).collect();
                m.allowed(&holders)
            }),
            Property::always(PRIORITY_ORDER, |_, s: &PriorityState| !s.out_of_order),
            Property::always(PRIORITY_NO_WAIT_FOR_EVER, |m: &PriorityModel, s: &PriorityState| {
                // Quiet: the only steps left are the environment's (a client that may never
                // come, a crash). Reads, conversions and releases are the system's, and come
                // in time once possible (a holder lets go; a woken waiter reads). Then nobody
                // may still wait.
                let mut next = vec![];
                m.actions(s, &mut next);
                let quiet = next.iter().all(|a| matches!(a, PriorityAction::Look(_) | PriorityAction::Crash(_)));
                !quiet || !s.clients.iter().any(|c| matches!(c, Client::Queued { .. }))
            }),
            // Immediate, not eventual: every waiter that stands by a "not yet" while it may be
            // granted now has been woken (a node it watches is gone), so it reads again.
            Property::always(PRIORITY_WOKEN, |m: &PriorityModel, s: &PriorityState| {
                s.clients.iter().enumerate().all(|(i, c)| match c {
                    Client::Queued { read: Some(read) } if !read.convert => {
                        let woken = read.watching.iter().any(|seq| !s.nodes.iter().any(|n| n.seq == *seq));
                        woken || !m.may_be_granted(&s.nodes, i as u8)
                    }
                    _ => true,
                })
            }),
            Property::sometimes("a client is granted after it waited", |_, s: &PriorityState| {
                s.clients.iter().zip(&s.waited).any(|(c, waited)| *c == Client::Holding && *waited)
            }),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(priorities: &[u8], permits: usize, off: &[PriorityRule]) -> PriorityModel {
        let limit = Limit::Permits(permits);
        PriorityModel { priorities: priorities.to_vec(), shared: vec![], limit, crashes: 1, off: off.to_vec() }
    }

    #[test]
    fn the_head_waiter_is_by_priority_then_arrival_and_granted_nodes_rank_first() {
        let m = model(&[0, 5, 5], 1, &[]);
        let nodes = [
            Node { client: 0, seq: 0, granted: true },
            Node { client: 2, seq: 1, granted: false },
            Node { client: 1, seq: 2, granted: false },
        ];
        assert_eq!(m.head_waiter(&nodes), Some(2), "same priority: first come");
        assert!(!m.may_be_granted(&nodes, 2), "the holder of priority 0 keeps its place");
        assert!(m.may_be_granted(&nodes[1..], 2));
        assert!(!m.may_be_granted(&nodes[1..], 1));
        let naive = model(&[0, 5, 5], 1, &[PriorityRule::GrantedFirst]);
        assert!(naive.may_be_granted(&nodes, 2), "the naive order puts a waiter ahead of the holder");
    }
}
