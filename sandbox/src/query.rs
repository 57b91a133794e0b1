//! Query parameters of an API request.

use std::collections::HashMap;

#[derive(Debug, Clone, Default)]
pub struct Query {
    map: HashMap<String, String>,
}

impl Query {
    pub fn parse(raw: Option<&str>) -> Self {
        let mut map = HashMap::new();
        if let Some(q) = raw {
            for (k, v) in form_urlencoded::parse(q.as_bytes()) {
                map.insert(k.into_owned(), v.into_owned());
            }
        }
        Query { map }
    }

    pub fn get(&self, k: &str) -> Option<&str> {
        self.map.get(k).map(String::as_str).filter(|v| !v.is_empty())
    }

    pub fn is_true(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1" | "True"))
    }

    pub fn dry_run(&self) -> bool {
        self.get("dryRun") == Some("All")
    }
}
