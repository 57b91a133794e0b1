//! Priorities in a lock directory (docs/design.md, "4. Priorities"), checked before the recipe
//! is built: with granted nodes ranked first and the conversion's `cversion` check, at most the
//! permits hold, every grant goes to the head of the waiters (priority, then arrival) and no
//! client waits for ever; with either rule off, the checker finds the hole.

use zklock_model::priorities::{
    PriorityAction, PriorityModel, PriorityRule, PRIORITY_MUTUAL_EXCLUSION, PRIORITY_NO_WAIT_FOR_EVER, PRIORITY_ORDER,
    PRIORITY_WOKEN,
};

fn model(priorities: &[u8], permits: usize, off: &[PriorityRule]) -> PriorityModel {
    PriorityModel { priorities: priorities.to_vec(), permits, crashes: 1, off: off.to_vec() }
}

fn shown(path: &[PriorityAction]) -> String {
    path.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>().join(" → ")
}

#[test]
fn with_granted_nodes_first_and_the_cversion_check_every_property_holds() {
    for (priorities, permits) in
        [(&[0, 5, 9][..], 1), (&[0, 5, 5, 9][..], 1), (&[0, 5, 9, 9][..], 2), (&[3, 3, 3][..], 1)]
    {
        let m = model(priorities, permits, &[]);
        let failed = m.clone().check();
        let failed: Vec<String> = failed.iter().map(|(p, path)| format!("{p}: {}", shown(path))).collect();
        assert!(failed.is_empty(), "priorities {priorities:?}, {permits} permits: {failed:#?}");
        assert!(m.reaches_a_grant_after_a_wait(), "{priorities:?}: the walk never grants a client that waited");
    }
}

#[test]
fn the_order_first_written_down_preempts_a_holder() {
    let failed = model(&[0, 5], 1, &[PriorityRule::GrantedFirst]).check();
    let path = failed.iter().find(|(p, _)| *p == PRIORITY_MUTUAL_EXCLUSION).map(|(_, path)| shown(path));
    let path = path.unwrap_or_else(|| panic!("no two holders under the naive order: {failed:?}"));
    println!("granted nodes not first, {PRIORITY_MUTUAL_EXCLUSION}:\n  {path}");
    // As docs/design.md quotes it.
    assert_eq!(path, "Enqueue(0) → Read(0) → Convert(0) → Enqueue(1) → Read(1) → Convert(1)");
}

#[test]
fn without_the_cversion_check_a_decision_on_an_older_directory_is_carried_out() {
    let failed = model(&[0, 9], 1, &[PriorityRule::CversionCheck]).check();
    let found: Vec<&str> = failed.iter().map(|(p, _)| *p).collect();
    assert!(
        found.contains(&PRIORITY_MUTUAL_EXCLUSION) && found.contains(&PRIORITY_ORDER),
        "two heads of two reads are both granted, the later one out of order: {found:?}"
    );
    for (property, path) in &failed {
        println!("no cversion check, {property}:\n  {}", shown(path));
    }
    let two = failed.iter().find(|(p, _)| *p == PRIORITY_MUTUAL_EXCLUSION).map(|(_, path)| shown(path));
    assert_eq!(two.as_deref(), Some("Enqueue(0) → Read(0) → Enqueue(1) → Read(1) → Convert(1) → Convert(0)"));
}

#[test]
fn a_waiter_that_watches_nothing_is_never_woken() {
    let failed = model(&[0, 5], 1, &[PriorityRule::WatchAhead]).check();
    let found: Vec<&str> = failed.iter().map(|(p, _)| *p).collect();
    assert!(
        found.contains(&PRIORITY_WOKEN) && found.contains(&PRIORITY_NO_WAIT_FOR_EVER),
        "a waiter left behind a lock that was let go: {found:?}"
    );
    for (property, path) in &failed {
        println!("watching nothing, {property}:\n  {}", shown(path));
    }
}
