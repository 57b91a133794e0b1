//! The time one trigger takes to become a reconcile in kube-runtime's `Controller`, beside a
//! channel to another task (the floor of any hop between tasks) and kube-runtime's scheduler
//! alone. The operator passes through such a hop wherever a watch event or the engine's news
//! starts a reconcile: twice on a holder pod's path (the pod's deletion, then the engine's Held
//! event), once on a handoff (the holder claim's deletion).
//!
//!     cargo run --release --example controller_hop [-- ROUNDS]
//!
//! No API server: each controller's store is filled by hand and its only trigger is
//! `reconcile_on`, as the operator's engine triggers it. A request due at once waits for the
//! timer's next tick or the one after, depending on where the scheduler's millisecond grid (set
//! when it is made) falls within the runtime's timer's: so there are 32 schedulers and 32
//! controllers, each made at a random point of a millisecond, the rounds spread over them. The
//! three kinds of rounds alternate in five batches; before each trigger the bench waits a random
//! 0–2 ms so that triggers fall anywhere within the timer's ticks, as events do.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::channel::mpsc::unbounded;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::scheduler::{scheduler, ScheduleRequest};
use kube::runtime::watcher;
use tokio::sync::mpsc;

const BATCHES: usize = 5;
/// Schedulers and controllers, each made at its own point of a millisecond.
const INSTANCES: usize = 32;
/// No round waits longer than this for its hop: a lost trigger fails the bench, not hangs it.
const DEADLINE: Duration = Duration::from_secs(5);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = std::env::args().nth(1).map(|n| n.parse()).transpose()?.unwrap_or(2_000);
    let per_batch = rounds.div_ceil(BATCHES);
    let mut jitter = Jitter::seeded();

    // The channel the operator's triggers take (futures' unbounded one), to a task that
    // answers with the time it received the message.
    let (channel_tx, mut channel_rx) = unbounded::<()>();
    let (channel_seen_tx, mut channel_seen) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while channel_rx.next().await.is_some() {
            let _ = channel_seen_tx.send(Instant::now());
        }
    });

    // A request due at once waits 1 or 2 ms, depending on where the queue's millisecond grid
    // (from its creation) falls within the runtime's timer's: several schedulers and
    // controllers, each made at a random point of a millisecond, and the rounds spread over them.
    let (scheduler_seen_tx, mut scheduler_seen) = mpsc::unbounded_channel();
    let (reconciled_tx, mut reconciled) = mpsc::unbounded_channel();
    let reconciled_tx = Arc::new(reconciled_tx);
    let (mut schedulers, mut controllers) = (Vec::new(), Vec::new());
    for instance in 0..INSTANCES {
        jitter.wait_up_to(Duration::from_millis(1));
        // kube-runtime's scheduler alone, as the controller runs it (no debounce).
        let (requests, scheduler_rx) = unbounded();
        let mut emitted = Box::pin(scheduler(scheduler_rx));
        let seen = scheduler_seen_tx.clone();
        tokio::spawn(async move {
            while emitted.next().await.is_some() {
                let _ = seen.send(Instant::now());
            }
        });
        schedulers.push(requests);

        jitter.wait_up_to(Duration::from_millis(1));
        // A controller over one object, triggered only through `reconcile_on`.
        let object = ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("hop-{instance}")),
                namespace: Some("bench".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let reference = ObjectRef::from_obj(&object);
        let (reader, mut writer) = reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(object));
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let (triggers, trigger_rx) = unbounded();
        let running = Controller::for_stream(futures::stream::pending(), reader)
            .reconcile_on(trigger_rx)
            .run(
                |_, seen: Arc<mpsc::UnboundedSender<Instant>>| async move {
                    let _ = seen.send(Instant::now());
                    Ok::<_, std::io::Error>(Action::await_change())
                },
                |_, _, _| Action::await_change(),
                reconciled_tx.clone(),
            )
            .for_each(|_| async {});
        tokio::spawn(running);
        controllers.push((triggers, reference));
    }

    let (mut channel, mut scheduled, mut controller) = (Vec::new(), Vec::new(), Vec::new());
    // One batch of each, not counted: the tasks' first polls, the timer's first entries.
    for counted in std::iter::once(false).chain(std::iter::repeat_n(true, BATCHES)) {
        let n = if counted { per_batch } else { 100 };
        let mut batch = Vec::with_capacity(n);
        for _ in 0..n {
            jitter.wait();
            let sent = Instant::now();
            channel_tx.unbounded_send(())?;
            batch.push(seen_after(&mut channel_seen, sent, "the channel's task").await?);
        }
        channel.extend(batch.drain(..).filter(|_| counted));
        for i in 0..n {
            jitter.wait();
            let sent = Instant::now();
            schedulers[i % INSTANCES].unbounded_send(ScheduleRequest { message: (), run_at: sent.into() })?;
            batch.push(seen_after(&mut scheduler_seen, sent, "the scheduler's emission").await?);
        }
        scheduled.extend(batch.drain(..).filter(|_| counted));
        for i in 0..n {
            jitter.wait();
            let sent = Instant::now();
            let (triggers, reference) = &controllers[i % INSTANCES];
            triggers.unbounded_send(reference.clone())?;
            batch.push(seen_after(&mut reconciled, sent, "the controller's reconcile").await?);
        }
        controller.extend(batch.drain(..).filter(|_| counted));
    }

    println!("trigger → seen, {} rounds each, alternating in {BATCHES} batches (µs):", channel.len());
    let floor = percentile(&mut channel, 50.0);
    for (name, samples) in [
        ("a channel to a task", &mut channel),
        ("kube-runtime scheduler alone", &mut scheduled),
        ("kube-runtime Controller (reconcile_on → reconcile)", &mut controller),
    ] {
        let (p50, p99) = (percentile(samples, 50.0), percentile(samples, 99.0));
        let long = samples.iter().filter(|d| **d >= Duration::from_micros(1_500)).count();
        let mean = samples.iter().sum::<Duration>() / samples.len().max(1) as u32;
        println!(
            "  {name:<52} mean {:>7.1}  p50 {:>7.1}  p99 {:>7.1}  p50 − channel's {:>7.1}  ≥ 1.5 ms: {:>3.0} %",
            micros(mean),
            micros(p50),
            micros(p99),
            micros(p50.saturating_sub(floor)),
            100.0 * long as f64 / samples.len().max(1) as f64
        );
    }
    Ok(())
}

/// The time from `sent` to the next instant `seen` reports, within [`DEADLINE`].
async fn seen_after(
    seen: &mut mpsc::UnboundedReceiver<Instant>,
    sent: Instant,
    what: &str,
) -> Result<Duration, String> {
    match tokio::time::timeout(DEADLINE, seen.recv()).await {
        Ok(Some(at)) => Ok(at.saturating_duration_since(sent)),
        Ok(None) => Err(format!("{what} ended")),
        Err(_) => Err(format!("no sign of {what} within {DEADLINE:?}")),
    }
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort_unstable();
    let at = ((samples.len() as f64 - 1.0) * p / 100.0).round() as usize;
    samples.get(at).copied().unwrap_or_default()
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// A random wait of 0–2 ms, spun rather than slept: a sleep would end on the timer's tick and
/// line every trigger up with it.
struct Jitter(u64);

impl Jitter {
    fn seeded() -> Self {
        // Any nonzero seed will do; xorshift only needs one.
        Jitter(
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1,
        )
    }

    fn wait(&mut self) {
        self.wait_up_to(Duration::from_millis(2));
    }

    fn wait_up_to(&mut self, most: Duration) {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        let until = Instant::now() + Duration::from_nanos(self.0 % most.as_nanos().max(1) as u64);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
}
