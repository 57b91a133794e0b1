//! What the API server spent: its CPU and requests, by resource.

use crate::harness::Server;
use std::collections::HashMap;
use std::process::Command;

/// What the benchmark reads of the control plane itself: the CPU time of its kube-apiserver
/// and etcd processes (when `scripts/k8s.sh` started them: it lists their PIDs beside the
/// kubeconfig) and the API server's own request and watch counters (its `/metrics`).
pub(crate) struct ServerProbe {
    pub(crate) client: kube::Client,
    pub(crate) apiserver: Option<u32>,
    pub(crate) etcd: Option<u32>,
    /// Other processes on the machine whose CPU time is read too (the operator, ZooKeeper, the
    /// bench): on two cores, every process's CPU per lifecycle bounds the rate.
    pub(crate) others: Vec<(&'static str, Option<u32>)>,
    pub(crate) tick: f64,
}

/// One reading of [`ServerProbe`].
#[derive(Clone)]
pub(crate) struct ServerSample {
    pub(crate) apiserver_cpu: Option<f64>,
    pub(crate) etcd_cpu: Option<f64>,
    /// The CPU seconds of [`ServerProbe::others`], in their order.
    pub(crate) others_cpu: Vec<(&'static str, Option<f64>)>,
    /// `VERB resource[/subresource]` → requests served.
    pub(crate) requests: HashMap<String, f64>,
    /// resource → watch events sent.
    pub(crate) watch_events: HashMap<String, f64>,
}

/// The resources whose requests a lifecycle is made of (the operator's leader Lease and epoch
/// ConfigMap are renewed on a timer, not per claim, and are left out).
pub(crate) const PROBED: [&str; 5] = ["lockclaims", "events", "pods", "locks", "lockhistories"];

impl ServerProbe {
    pub(crate) fn new(client: &kube::Client, server: &Server) -> ServerProbe {
        let pids = server.kubeconfig.parent().map(|dir| dir.join("pids"));
        let pids = pids.and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default();
        let pid = |name: &str| {
            pids.lines().find_map(|l| l.split_once(' ').filter(|(_, n)| *n == name).and_then(|(p, _)| p.parse().ok()))
        };
        let tick = Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0);
        let (apiserver, etcd) = (pid("kube-apiserver"), pid("etcd"));
        ServerProbe { client: client.clone(), apiserver, etcd, others: vec![], tick }
    }

    /// Reads process `pid`'s CPU time too, as `name`.
    pub(crate) fn with(mut self, name: &'static str, pid: Option<u32>) -> ServerProbe {
        self.others.push((name, pid));
        self
    }

    /// CPU seconds (user + system) a process has used.
    pub(crate) fn cpu(&self, pid: Option<u32>) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
        // Fields after the command name (which may hold spaces): utime and stime are 12th and 13th.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
        Some(ticks / self.tick)
    }

    pub(crate) async fn sample(&self) -> ServerSample {
        let mut sample = ServerSample {
            apiserver_cpu: self.cpu(self.apiserver),
            etcd_cpu: self.cpu(self.etcd),
            others_cpu: self.others.iter().map(|(name, pid)| (*name, self.cpu(*pid))).collect(),
            requests: HashMap::new(),
            watch_events: HashMap::new(),
        };
        let Ok(request) = http::Request::get("/metrics").body(vec![]) else { return sample };
        // A server that does not let us read its metrics leaves the counters empty.
        let text = self.client.request_text(request).await.unwrap_or_default();
        for line in text.lines() {
            let Some((name, rest)) = line.split_once('{') else { continue };
            let Some((labels, value)) = rest.rsplit_once("} ") else { continue };
            let Ok(value) = value.trim().parse::<f64>() else { continue };
            let label = |key: &str| {
                let start = labels.find(&format!("{key}=\""))? + key.len() + 2;
                labels[start..].split('"').next()
            };
            let resource = label("resource").unwrap_or_default();
            if !PROBED.contains(&resource) {
                continue;
            }
            match name {
                "apiserver_request_total" => {
                    let sub =
                        label("subresource").filter(|s| !s.is_empty()).map(|s| format!("/{s}")).unwrap_or_default();
                    let key = format!("{} {resource}{sub}", label("verb").unwrap_or_default());
                    *sample.requests.entry(key).or_default() += value;
                }
                "apiserver_watch_events_total" => {
                    *sample.watch_events.entry(resource.to_string()).or_default() += value
                }
                _ => {}
            }
        }
        sample
    }
}

impl ServerSample {
    /// kube-apiserver's CPU seconds between `before` and this sample, when it was measured.
    pub(crate) fn apiserver_cpu_since(&self, before: &ServerSample) -> Option<f64> {
        Some(self.apiserver_cpu? - before.apiserver_cpu?)
    }

    /// Adds to this reading what changed from `before` to `after`: a reading that has added
    /// several such spans, read with [`ServerSample::per`] against the reading it started as,
    /// gives their sum (batches of a part that alternate with other work).
    pub(crate) fn add(&mut self, before: &ServerSample, after: &ServerSample) {
        let add = |total: &mut Option<f64>, before: Option<f64>, after: Option<f64>| {
            *total = match (*total, before, after) {
                (Some(t), Some(b), Some(a)) => Some(t + a - b),
                _ => None,
            }
        };
        add(&mut self.apiserver_cpu, before.apiserver_cpu, after.apiserver_cpu);
        add(&mut self.etcd_cpu, before.etcd_cpu, after.etcd_cpu);
        for (((_, total), (_, b)), (_, a)) in self.others_cpu.iter_mut().zip(&before.others_cpu).zip(&after.others_cpu)
        {
            add(total, *b, *a);
        }
        for (totals, before, after) in [
            (&mut self.requests, &before.requests, &after.requests),
            (&mut self.watch_events, &before.watch_events, &after.watch_events),
        ] {
            for (key, a) in after {
                *totals.entry(key.clone()).or_default() += a - before.get(key).copied().unwrap_or(0.0);
            }
        }
    }

    /// What the API server did between `before` and this sample, per `lifecycles`, as lines.
    pub(crate) fn per(&self, before: &ServerSample, lifecycles: usize, what: &str) -> String {
        let n = lifecycles as f64;
        let ms = |after: Option<f64>, before: Option<f64>| match (after, before) {
            (Some(a), Some(b)) => format!("{:.2} ms", (a - b) * 1000.0 / n),
            _ => "not measured (the control plane was not started by this project)".into(),
        };
        let mut out = format!(
            "kube-apiserver CPU per {what}: {} (etcd {}) over {lifecycles}\n",
            ms(self.apiserver_cpu, before.apiserver_cpu),
            ms(self.etcd_cpu, before.etcd_cpu)
        );
        if !self.others_cpu.is_empty() {
            let mut total = 0.0;
            let mut each = vec![];
            let all = [
                ("kube-apiserver", self.apiserver_cpu, before.apiserver_cpu),
                ("etcd", self.etcd_cpu, before.etcd_cpu),
            ];
            let others = self.others_cpu.iter().zip(&before.others_cpu).map(|((name, a), (_, b))| (*name, *a, *b));
            for (name, after, before) in all.into_iter().chain(others) {
                if let (Some(a), Some(b)) = (after, before) {
                    total += (a - b) * 1000.0 / n;
                    each.push(format!("{name} {:.2}", (a - b) * 1000.0 / n));
                }
            }
            // The processes share the cores: the rate is at most their CPU seconds a second over this.
            let cores = cores();
            let most = 1000.0 * cores as f64 / total.max(f64::MIN_POSITIVE);
            out.push_str(&format!(
                "the machine's CPU per {what}: {total:.2} ms ({}); {cores} cores: at most {most:.0}/s\n",
                each.join(", "),
            ));
        }
        let delta = |after: &HashMap<String, f64>, before: &HashMap<String, f64>| {
            let mut d: Vec<(String, f64)> = after
                .iter()
                .map(|(k, v)| (k.clone(), (v - before.get(k).copied().unwrap_or(0.0)) / n))
                .filter(|(_, v)| *v >= 0.005)
                .collect();
            d.sort_by(|a, b| a.0.cmp(&b.0));
            d
        };
        let requests = delta(&self.requests, &before.requests);
        if requests.is_empty() {
            out.push_str("API requests per lifecycle: not served by this API server's /metrics\n");
            return out;
        }
        let total: f64 = requests.iter().filter(|(k, _)| !k.starts_with("WATCH")).map(|(_, v)| v).sum();
        let listed: Vec<String> = requests.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
        out.push_str(&format!("API requests per {what}: {total:.2} ({})\n", listed.join(", ")));
        let watch: Vec<String> =
            delta(&self.watch_events, &before.watch_events).iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
        out.push_str(&format!("watch events sent per {what}: {}", watch.join(", ")));
        out
    }
}

/// The machine's cores (what the processes of a run share).
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}
