//! Everything behind the server's single lock: the registry of served resources and the store.

use crate::registry::Registry;
use crate::store::Store;

pub struct State {
    pub registry: Registry,
    pub store: Store,
}

impl State {
    pub fn new(history_limit: usize) -> Self {
        State { registry: Registry::with_builtins(), store: Store::new(history_limit) }
    }
}
