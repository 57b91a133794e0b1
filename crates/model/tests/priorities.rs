//! Priorities in a lock directory (docs/design.md, "4. Priorities"), checked before the recipe
//! is built: with granted nodes ranked first and the conversion's `cversion` check, at most the
//! permits hold, every grant goes to the head of the waiters (priority, then arrival) and no
//! client waits for ever; with either rule off, the checker finds the hole.

use zklock_model::priorities::{
    Limit, PriorityAction, PriorityModel, PriorityRule, PRIORITY_MUTUAL_EXCLUSION, PRIORITY_NO_WAIT_FOR_EVER,
    PRIORITY_ORDER, PRIORITY_WOKEN,
};

fn model(priorities: &[u8], limit: Limit, off: &[PriorityRule]) -> PriorityModel {
    PriorityModel { priorities: priorities.to_vec(), shared: vec![], limit, crashes: 1, off: off.to_vec() }
}

/// A mutex whose clients `shared` want it Shared.
fn with_modes(priorities: &[u8], shared: &[u8], off: &[PriorityRule]) -> PriorityModel {
    PriorityModel { shared: shared.to_vec(), ..model(priorities, Limit::Mutex, off) }
}

fn shown(path: &[PriorityAction]) -> String {
    path.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>().join(" → ")
}

/// The properties the whole walk of `m` breaks, each printed with a path to it.
fn broken(m: PriorityModel, what: &str) -> Vec<&'static str> {
    let failed = m.check();
    for (property, path) in &failed {
        println!("{what}, {property}:\n  {}", shown(path));
    }
    failed.into_iter().map(|(p, _)| p).collect()
}

#[test]
fn with_its_three_rules_every_property_holds() {
    let models = [
        model(&[0, 5, 9], Limit::Mutex, &[]),
        model(&[0, 5, 5, 9], Limit::Mutex, &[]),
        model(&[0, 5, 9, 9], Limit::Permits(2), &[]),
        model(&[3, 3, 3], Limit::Permits(1), &[]),
        // Readers and writers: a Shared head joins Shared holders, an Exclusive one waits.
        with_modes(&[0, 5, 9], &[0, 2], &[]),
        with_modes(&[5, 0, 5, 9], &[0, 1, 3], &[]),
    ];
    for m in models {
        let what = format!("priorities {:?}, shared {:?}, {:?}", m.priorities, m.shared, m.limit);
        let failed = m.clone().check();
        let failed: Vec<String> = failed.iter().map(|(p, path)| format!("{p}: {}", shown(path))).collect();
        assert!(failed.is_empty(), "{what}: {failed:#?}");
        assert!(m.reaches_a_grant_after_a_wait(), "{what}: the walk never grants a client that waited");
    }
}

#[test]
fn the_order_first_written_down_preempts_a_holder() {
    let m = model(&[0, 5], Limit::Mutex, &[PriorityRule::GrantedFirst]);
    let path = m.shortest(PRIORITY_MUTUAL_EXCLUSION).map(|path| shown(&path));
    let path = path.unwrap_or_else(|| panic!("no two holders under the naive order"));
    println!("granted nodes not first, {PRIORITY_MUTUAL_EXCLUSION}:\n  {path}");
    // As docs/design.md quotes it.
    assert_eq!(path, "Look(0) → Enqueue(0) → Read(0) → Convert(0) → Look(1) → Enqueue(1) → Read(1) → Convert(1)");
}

#[test]
fn without_the_cversion_check_a_decision_on_an_older_directory_is_carried_out() {
    // A third client: the first waits behind it, so that a later one can overtake the first.
    let m = model(&[0, 9, 5], Limit::Mutex, &[PriorityRule::CversionCheck]);
    let found = broken(m.clone(), "no cversion check");
    assert!(
        found.contains(&PRIORITY_MUTUAL_EXCLUSION) && found.contains(&PRIORITY_ORDER),
        "two heads of two reads are both granted, the later one out of order: {found:?}"
    );
    let two = m.clone().shortest(PRIORITY_MUTUAL_EXCLUSION).map(|path| shown(&path));
    let overtaken = m.shortest(PRIORITY_ORDER).map(|path| shown(&path));
    // As docs/design.md quotes them: two that found the lock free both grant themselves at once;
    // one that found it free grants itself over a waiter enqueued since.
    assert_eq!(two.as_deref(), Some("Look(1) → Look(2) → GrantAtOnce(2) → GrantAtOnce(1)"));
    assert_eq!(
        overtaken.as_deref(),
        Some("Look(1) → Look(2) → GrantAtOnce(2) → Look(0) → Enqueue(0) → GrantAtOnce(1)")
    );
}

#[test]
fn a_waiter_that_watches_nothing_is_never_woken() {
    let found = broken(model(&[0, 5], Limit::Mutex, &[PriorityRule::WatchAhead]), "watching nothing");
    assert!(
        found.contains(&PRIORITY_WOKEN) && found.contains(&PRIORITY_NO_WAIT_FOR_EVER),
        "a waiter left behind a lock that was let go: {found:?}"
    );
}
